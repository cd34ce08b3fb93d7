"""Model surgery timings: ``workbench.edit``'s extract against ``onnx.utils.extract_model``, and
the cost of an edit's checks and of a re-batch, on the torch.onnx exports of
``tests/helpers/torch_models.py``.

    python benchmarks/bench_edit.py                 # ResNet-18 (64x64), BERT-like, GPT-2-like
    python benchmarks/bench_edit.py --repeat 5

Run from the repository root (it imports ``tests/helpers``). Each time is the best of
``--repeat`` runs in this process; say which CPU gave the numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _best(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _models():
    import torch  # noqa: PLC0415

    from tests.helpers import torch_models  # noqa: PLC0415

    model, _ = torch_models.build("resnet18")
    x = torch.from_numpy(torch_models.example_inputs("resnet18", 1, image=64)[0])
    yield ("resnet18", torch_models.export_onnx(model, (x,), None, opset=17),
           "/layer1/layer1.1/relu_1/Relu_output_0", "/layer3/layer3.1/relu_1/Relu_output_0")
    for name in ("bert", "gpt2"):
        model, example = torch_models.build(name)
        baked = torch_models.export_onnx(model, example, None, opset=17, dynamic_batch=False)
        ln = [n.output[0] for n in baked.graph.node if n.op_type == "LayerNormalization"]
        yield name, baked, ln[0], ln[-1]


def _row(name, m, a, b, folder, repeat) -> str:
    import onnx  # noqa: PLC0415
    from onnx.utils import extract_model  # noqa: PLC0415

    from workbench import edit  # noqa: PLC0415
    from workbench.edit.registry import EDITS, Context  # noqa: PLC0415

    src = os.path.join(folder, f"{name}.onnx")
    onnx.save(m, src)
    try:
        t_onnx = _best(lambda: extract_model(src, os.path.join(folder, "part.onnx"), [a], [b]),
                       repeat)
        onnx_txt = f"{t_onnx:18.3f}s"
    except Exception as e:  # noqa: BLE001 - it refuses parts that need other inputs
        onnx_txt = f"{'fails (' + type(e).__name__ + ')':>19}"
    s = edit.open(m)
    st = s._states[0]

    def edit_only():
        EDITS["extract"](st.draft(), Context(s.checker, st), inputs=[a], outputs=[b])

    def with_checks():
        s.extract([a], [b])
        s.undo()

    def rebatch():
        s.rebatch(4)
        s.undo()
    t_edit = _best(edit_only, repeat)
    t_chk = _best(with_checks, repeat)
    t_rb = _best(rebatch, repeat)
    return f"{name:10} {onnx_txt} {t_edit:12.3f}s {t_chk:8.3f}s {t_rb:14.3f}s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{'model':10} {'onnx extract_model':>19} {'edit extract':>13} {'+ checks':>9} "
          f"{'rebatch+checks':>15}")
    with tempfile.TemporaryDirectory() as d:
        for name, m, a, b in _models():
            print(_row(name, m, a, b, d, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
