"""Build the embedded default model: a small CNN trained on scikit-learn's 8x8 digits.

This bootstrap version trains with PyTorch CPU (a dev-time tool, never a runtime dependency)
and writes ``workbench/data/default_model.onnx`` plus ``workbench/data/digits_sample.npz``
(held-out images the demo classifies). ``scripts/retrain_default_model.py`` retrains the same
architecture with the workbench's own training stack.

    python scripts/make_default_model.py
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "workbench", "data")


def main() -> None:
    import onnx
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    torch.manual_seed(0)
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Dropout(0.1), nn.Linear(32, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=60 * 22)
    for _epoch in range(60):
        model.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean()
    print(f"test accuracy {acc:.4f}")

    os.makedirs(DATA, exist_ok=True)
    path = os.path.join(DATA, "default_model.onnx")
    fd, tmp = tempfile.mkstemp(dir=DATA, suffix=".onnx.tmp")
    os.close(fd)
    torch.onnx.export(model, (torch.from_numpy(xte[:1]),), tmp, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "batch"},
                                                             "logits": {0: "batch"}},
                      opset_version=13, dynamo=False)
    m = onnx.load(tmp)
    m.doc_string = ("Digits CNN: 8x8 grayscale digit images in [0, 1] (scikit-learn's digits "
                    f"/16), shape [batch, 1, 8, 8] -> 10 logits. Test accuracy {acc:.4f}.")
    m.producer_name = "onnx-workbench scripts/make_default_model.py"
    onnx.checker.check_model(m)
    onnx.save(m, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    sample = os.path.join(DATA, "digits_sample.npz")
    np.savez_compressed(sample, images=xte[:32], labels=yte[:32])
    print("wrote", path, os.path.getsize(path), "bytes and", sample)


if __name__ == "__main__":
    main()
