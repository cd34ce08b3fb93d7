"""Write the small torch.onnx *dynamo* exports that ``tests/autograd/test_dynamo_exports.py``
trains (committed under ``tests/data/``, so the tests need neither onnxscript nor the dynamo
exporter).

Made with torch 2.9 (CPU) and onnxscript 0.7.2::

    PYTHONPATH=.:<a folder with onnxscript> python3 scripts/make_dynamo_test_exports.py

The blocks are the BERT-style and GPT-2-style self-attention blocks of
``tests/autograd/test_fusion_exports.py`` (``_torch_blocks``), seeded and perturbed as there,
exported with ``torch.onnx.export(..., dynamo=True)`` (opset 18, a dynamic batch). The dynamo
exporter writes every scalar constant as a 0-d initializer (the attention scale, GELU's
sqrt(2), 1 and 0.5, the mask's 1 and finfo.min) and its GELU as ``x * ((1 + erf(x / sqrt2))
* 0.5)``; the parameters keep their ``state_dict`` names.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.autograd.test_fusion_exports import _feeds, _torch_blocks  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for case in ("bert", "gpt2"):
        torch.manual_seed(0)
        model = _torch_blocks(torch)[case]().eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape) * 0.05)
        feeds = _feeds(case, 2, np.random.default_rng(3))
        args = tuple(torch.from_numpy(a) for a in feeds)
        batch = torch.export.Dim("batch", min=1, max=64)
        shapes = tuple({0: batch} for _ in args)
        prog = torch.onnx.export(model, args, dynamo=True, opset_version=18,
                                 input_names=["x", "mask"][:len(args)], output_names=["y"],
                                 dynamic_shapes=shapes)
        proto = prog.model_proto
        proto.producer_name += " (scripts/make_dynamo_test_exports.py)"
        for n in proto.graph.node:   # the exporter's stack traces and FX names: not needed
            del n.metadata_props[:]
        path = os.path.join(OUT, f"dynamo_{case}_block.onnx")
        onnx.save(proto, path)
        print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
