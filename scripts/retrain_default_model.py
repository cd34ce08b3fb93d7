"""Retrain the embedded default model with the workbench's own stack (no PyTorch).

The architecture is the one of ``scripts/make_default_model.py`` (a small CNN for
scikit-learn's 8x8 digits), built from ``workbench.layer``s, trained with ``workbench.opt.Adam``
and a one-cycle learning-rate schedule, and exported with ``sonnx.to_onnx`` (input ``image``
[batch, 1, 8, 8] in [0, 1], output ``logits`` [batch, 10], dynamic batch axis).

    python scripts/retrain_default_model.py                       # -> a new file is refused
    python scripts/retrain_default_model.py --overwrite           # replace the shipped model
    python scripts/retrain_default_model.py --output /tmp/digits.onnx --epochs 10

The file is written through a temporary file and an atomic rename; an existing file is replaced
only with ``--overwrite``. ``digits_sample.npz`` (held-out images for the demo) is written beside
it when missing.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEFAULT_OUT = os.path.join(ROOT, "workbench", "data", "default_model.onnx")


def build_model():
    from workbench import autograd, layer, model

    class DigitsCNN(model.Model):
        def __init__(self):
            super().__init__()
            self.conv1 = layer.Conv2d(1, 16, 3, padding=1)
            self.bn1 = layer.BatchNorm2d(16)
            self.conv2 = layer.Conv2d(16, 32, 3, padding=1)
            self.bn2 = layer.BatchNorm2d(32)
            self.pool = layer.MaxPool2d(2)
            self.conv3 = layer.Conv2d(32, 32, 3, padding=1)
            self.gap = layer.GlobalAvgPool2d()
            self.flat = layer.Flatten()
            self.drop = layer.Dropout(0.1)
            self.fc = layer.Linear(32, 10)

        def forward(self, x):
            x = autograd.relu(self.bn1(self.conv1(x)))
            x = self.pool(autograd.relu(self.bn2(self.conv2(x))))
            x = self.flat(self.gap(autograd.relu(self.conv3(x))))
            return self.fc(self.drop(x))

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = autograd.softmax_cross_entropy(out, y)
            self.optimizer.backward_and_update(loss)
            return out, loss

    return DigitsCNN()


class OneCycle:
    """Learning rate warming up linearly to ``peak`` then annealing with a cosine."""

    def __init__(self, peak: float, total: int, warmup: float = 0.3):
        self.peak, self.total, self.warm = peak, max(1, total), max(1, int(total * warmup))

    def __call__(self, step: int) -> float:
        if step < self.warm:
            return self.peak * (0.04 + 0.96 * step / self.warm)
        t = min(1.0, (step - self.warm) / max(1, self.total - self.warm))
        return self.peak * (0.5 * (1 + math.cos(math.pi * t))) + 1e-5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default=DEFAULT_OUT)
    ap.add_argument("--overwrite", action="store_true", help="replace an existing file")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if os.path.exists(args.output) and not args.overwrite:
        print(f"{args.output} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from workbench import autograd, opt, sonnx, tensor
    from workbench.graph.export import save_atomic

    tensor.seed(args.seed)
    autograd.manual_seed(args.seed)
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    m = build_model()
    bs = args.batch_size
    steps = args.epochs * math.ceil(len(xtr) / bs)
    m.set_optimizer(opt.Adam(lr=OneCycle(args.lr, steps)))
    m.compile([tensor.PlaceHolder((bs, 1, 8, 8))], is_train=True, use_graph=True)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        m.train()
        perm = rng.permutation(len(xtr))
        total = 0.0
        for i in range(0, len(perm), bs):
            b = perm[i:i + bs]
            _, loss = m(tensor.from_numpy(xtr[b]), tensor.from_numpy(ytr[b]))
            total += loss.item() * len(b)
        m.eval()
        acc = float((m(tensor.from_numpy(xte)).numpy().argmax(1) == yte).mean())
        print(f"epoch {epoch + 1:3d}  loss {total / len(xtr):.4f}  test accuracy {acc:.4f}  "
              f"({time.perf_counter() - t0:.1f}s)", flush=True)

    m.eval()
    image = tensor.PlaceHolder((1, 1, 8, 8))
    logits = m.forward(image)
    proto = sonnx.to_onnx([image], [logits], input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                          model_name="digits_cnn")
    proto.doc_string = ("Digits CNN: 8x8 grayscale digit images in [0, 1] (scikit-learn's digits "
                        f"/16), shape [batch, 1, 8, 8] -> 10 logits. Test accuracy {acc:.4f}.")
    proto.producer_name = "onnx-workbench scripts/retrain_default_model.py"
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    save_atomic(proto, args.output, overwrite=args.overwrite)
    sample = os.path.join(out_dir, "digits_sample.npz")
    if not os.path.exists(sample):
        tmp = sample + f".{os.getpid()}.tmp.npz"
        np.savez_compressed(tmp, images=xte[:32], labels=yte[:32])
        os.replace(tmp, sample)
    print(f"wrote {args.output} ({os.path.getsize(args.output):,} bytes), test accuracy "
          f"{acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
