"""Output comparison and the onnxruntime oracle (tests and benchmarks only).

>>> import numpy as np
>>> normalised_max_error(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
0.2
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np


def normalised_max_error(a, b) -> float:
    """``max|a - b| / max(max|b|, 1e-12)``: ``b`` is the reference.

    Shapes must match exactly (no broadcasting). Non-finite values at the same positions with
    the same value (e.g. ``-inf`` in both) count as equal; anywhere else they give ``inf``.
    Integer/bool outputs are compared in float64.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise AssertionError(f"shape mismatch: got {a.shape}, reference {b.shape}")
    if a.size == 0:
        return 0.0
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    same = (a == b)  # equal infinities
    finite = np.isfinite(a) & np.isfinite(b)
    if not np.all(same | finite):
        return float("inf")
    diff = np.where(same, 0.0, np.abs(a - b))
    scale = np.abs(np.where(np.isfinite(b), b, 0.0)).max()
    return float(diff.max() / max(scale, 1e-12))


def ort_session(model, *, threads: int | None = None, optimize: bool = True):
    """An onnxruntime CPU ``InferenceSession`` for a ModelProto, bytes or path.

    ``threads``: intra-op threads (``None`` = onnxruntime's default, i.e. all cores).
    """
    import onnxruntime as ort  # noqa: PLC0415

    so = ort.SessionOptions()
    so.log_severity_level = 3  # no warnings about unused initializers in the light_* models
    if threads is not None:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, (str, os.PathLike)):
        data = os.fspath(model)
    elif isinstance(model, bytes):
        data = model
    else:
        data = model.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=["CPUExecutionProvider"])


def _feed_dict(names: Sequence[str], inputs) -> dict:
    if isinstance(inputs, Mapping):
        return dict(inputs)
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    if len(inputs) != len(names):
        raise AssertionError(f"{len(inputs)} inputs given, the model takes {len(names)}: {names}")
    return dict(zip(names, inputs))


def run_ort(model_or_session, inputs, **session_kwargs) -> list[np.ndarray]:
    """Run onnxruntime on ``inputs`` (list in graph-input order, or a dict by name)."""
    sess = model_or_session
    if not hasattr(sess, "get_inputs"):
        sess = ort_session(model_or_session, **session_kwargs)
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, _feed_dict(names, inputs))


def run_workbench(model_or_rep, inputs, device: str = "CPU") -> list[np.ndarray]:
    """Run ``workbench.backend`` on ``inputs``; returns the outputs as a list of numpy arrays."""
    rep = model_or_rep
    if not hasattr(rep, "run"):
        import workbench.backend as backend  # noqa: PLC0415

        rep = backend.prepare(model_or_rep, device=device)
    return [np.asarray(o) for o in rep.run(inputs)]


def assert_outputs_close(got: Sequence, ref: Sequence, *, tol: float = 1e-3, names=None,
                         what: str = "") -> list[float]:
    """Assert every output's normalised max error is <= ``tol``; returns the errors.

    The failure message lists every output with its error, shape and dtype.
    """
    if len(got) != len(ref):
        raise AssertionError(f"{what}: {len(got)} outputs, reference has {len(ref)}")
    names = list(names or [f"output {i}" for i in range(len(ref))])
    errs, lines, bad = [], [], False
    for name, g, r in zip(names, got, ref):
        g, r = np.asarray(g), np.asarray(r)
        if g.dtype != r.dtype:
            lines.append(f"  {name}: dtype {g.dtype}, reference {r.dtype}")
            bad = True
        try:
            e = normalised_max_error(g, r)
        except AssertionError as exc:
            lines.append(f"  {name}: {exc}")
            errs.append(float("inf"))
            bad = True
            continue
        errs.append(e)
        flag = "" if e <= tol else "   <-- over tolerance"
        bad |= e > tol
        lines.append(f"  {name}: normalised max error {e:.3g} (shape {r.shape}, "
                     f"max|ref| {np.abs(r).max() if r.size else 0:.3g}){flag}")
    if bad:
        raise AssertionError(f"{what} outputs differ from the reference (tolerance {tol:g}):\n"
                             + "\n".join(lines))
    return errs
