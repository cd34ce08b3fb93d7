"""Control-flow kernels: If, Loop, Scan.

Subgraph attributes arrive as callables prepared by the executor (outer-scope values already
bound): ``then_branch()`` / ``else_branch()`` take no inputs, Loop's ``body(iteration_num, cond,
*loop_carried)`` returns ``[cond, *loop_carried, *scan_output_elements]`` and Scan's
``body(*state, *scan_input_elements)`` returns ``[*state, *scan_output_elements]``. Values may be
arrays, sequences (lists) or optionals; the kernels pass them through untouched.
"""

from __future__ import annotations

import numpy as np

from workbench.arrays import xp_of
from workbench.errors import InputError, ShapeError
from workbench.limits import check_alloc, check_iterations
from workbench.ops.registry import kernel


def _scalar_bool(op: str, name: str, value) -> bool:
    size = int(np.prod(value.shape)) if hasattr(value, "shape") else 1
    if size != 1:
        raise InputError(f"{op}: '{name}' must hold exactly one element, got shape "
                         f"{tuple(value.shape)}")
    return bool(value.reshape(-1)[0]) if hasattr(value, "reshape") else bool(value)


def _outputs(values):
    """One value stays one value; several become the tuple the executor expects."""
    values = list(values)
    return values[0] if len(values) == 1 else tuple(values)


def _stack(op: str, what: str, elems, axis: int = 0):
    xp = xp_of(elems)
    try:
        return xp.stack(elems, axis=axis)
    except ValueError:
        shapes = sorted({tuple(e.shape) for e in elems})
        raise ShapeError(f"{op}: the {what} changed shape across iterations ({shapes}); "
                         f"scan outputs are stacked and need one shape") from None


@kernel("If", since=1, category="control")
def if_(cond, *, then_branch, else_branch):
    """Run one branch (one kernel for every If version: later ones only widen the types)."""
    branch = then_branch if _scalar_bool("If", "cond", cond) else else_branch
    return _outputs(branch())


@kernel("Loop", since=1, wants_ctx=True, category="control")
def loop(M, cond, *v_initial, body, ctx):
    """``for i in range(M) while cond``: M and cond may be omitted (None). The condition the
    body returns is always honoured (as onnxruntime does), also when the cond input was
    omitted. Scan outputs are stacked on a new axis 0; with zero iterations they are empty
    float32 arrays of shape (0,) (their element type and shape are unknown to the kernel)."""
    xp = xp_of(M, cond, *v_initial)
    max_trip = None if M is None else int(M.reshape(-1)[0])
    keep_going = True if cond is None else _scalar_bool("Loop", "cond", cond)
    carried = list(v_initial)
    n_carried = len(carried)
    n_scan = ctx.n_outputs - n_carried
    scans: list[list] = [[] for _ in range(max(n_scan, 0))]
    i = 0
    scan_bytes = 0
    what = f"Loop (trip count {'unbounded' if max_trip is None else max_trip})"
    while keep_going and (max_trip is None or i < max_trip):
        # a Python-level loop: Jupyter's stop button (KeyboardInterrupt) lands between
        # iterations and leaves the process usable
        check_iterations(i, what=what)
        res = body(xp.asarray(i, dtype=np.int64), xp.asarray(keep_going), *carried)
        if len(res) < 1 + n_carried:
            raise InputError(f"Loop: body returned {len(res)} values; it must return the "
                             f"condition and {n_carried} loop-carried values first")
        keep_going = _scalar_bool("Loop", "body condition output", res[0])
        carried = list(res[1:1 + n_carried])
        elems = res[1 + n_carried:]
        if len(scans) < len(elems):
            scans.extend([] for _ in range(len(elems) - len(scans)))
        for k, e in enumerate(elems):
            scans[k].append(e)
            scan_bytes += int(getattr(e, "nbytes", 0))
        if elems:
            check_alloc((scan_bytes,), itemsize=1, what="Loop: the scan outputs so far")
        i += 1
    outs = carried
    for k, elems in enumerate(scans):
        if elems:
            outs.append(_stack("Loop", f"scan output {k}", elems))
        else:  # zero iterations: the element shape and dtype are unknown
            outs.append(xp.zeros((0,), dtype=np.float32))
    return _outputs(outs[:ctx.n_outputs] if ctx.n_outputs else outs)


def _take(x, index: int, axis: int):
    return x[(slice(None),) * axis + (index,)]


def _norm_axes(op: str, attr: str, axes, ranks) -> list[int]:
    if axes is None:
        return [0] * len(ranks)
    axes = list(axes)
    if len(axes) != len(ranks):
        raise InputError(f"{op}: '{attr}' has {len(axes)} entries, expected {len(ranks)}")
    out = []
    for a, r in zip(axes, ranks):
        if not -r <= a < r:
            raise ShapeError(f"{op}: {attr} value {a} is out of range for rank {r}")
        out.append(a % r)
    return out


@kernel("Scan", since=9, wants_ctx=True, category="control")
def scan(*initial_state_and_scan_inputs, body, num_scan_inputs, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
         ctx):
    """Opset 9+ Scan: no batch axis; per-input scan axes and directions, per-output stacking
    axes and directions (1 = prepend, i.e. reversed)."""
    inputs = initial_state_and_scan_inputs
    m = int(num_scan_inputs)
    n = len(inputs) - m
    if n < 0:
        raise InputError(f"Scan: num_scan_inputs={m} but only {len(inputs)} inputs given")
    states = list(inputs[:n])
    scan_ins = inputs[n:]
    in_axes = _norm_axes("Scan", "scan_input_axes", scan_input_axes,
                         [s.ndim for s in scan_ins])
    in_dirs = list(scan_input_directions) if scan_input_directions else [0] * m
    lengths = {s.shape[a] for s, a in zip(scan_ins, in_axes)}
    if len(lengths) > 1:
        raise ShapeError(f"Scan: scan inputs have different lengths along their scan axes: "
                         f"{[tuple(s.shape) for s in scan_ins]} with axes {in_axes}")
    steps = lengths.pop() if lengths else 0
    if steps:
        check_iterations(steps - 1, what=f"Scan ({steps} steps)")
    k = ctx.n_outputs - n
    elems: list[list] = [[] for _ in range(k)]
    for t in range(steps):
        xs = [_take(s, steps - 1 - t if d else t, a) for s, a, d in zip(scan_ins, in_axes, in_dirs)]
        res = body(*states, *xs)
        states = list(res[:n])
        for j, e in enumerate(res[n:n + k]):
            elems[j].append(e)
    out_dirs = list(scan_output_directions) if scan_output_directions else [0] * k
    outs = list(states)
    xp = xp_of(*inputs)
    for j in range(k):
        if not elems[j]:
            outs.append(xp.zeros((0,), dtype=np.float32))
            continue
        seq = elems[j][::-1] if out_dirs[j] else elems[j]
        r = seq[0].ndim + 1
        axis = 0 if scan_output_axes is None else scan_output_axes[j]
        if not -r <= axis < r:
            raise ShapeError(f"Scan: scan_output_axes value {axis} out of range for rank {r}")
        outs.append(_stack("Scan", f"scan output {j}", seq, axis % r))
    return _outputs(outs)


@kernel("Scan", since=8, wants_ctx=True)
def scan_8(sequence_lens, *initial_state_and_scan_inputs, body, num_scan_inputs,
           directions=None, ctx):
    """Opset-8 Scan: batch axis 0, sequence axis 1, optional per-batch sequence lengths."""
    inputs = initial_state_and_scan_inputs
    m = int(num_scan_inputs)
    n = len(inputs) - m
    states0 = inputs[:n]
    scan_ins = inputs[n:]
    if not scan_ins:
        raise InputError("Scan-8 needs at least one scan input")
    batch, max_len = scan_ins[0].shape[0], scan_ins[0].shape[1]
    for s in scan_ins:
        if s.shape[0] != batch or s.shape[1] != max_len:
            raise ShapeError(f"Scan-8: scan inputs must share batch size and sequence length, "
                             f"got {[tuple(s.shape) for s in scan_ins]}")
    lens = ([max_len] * batch if sequence_lens is None
            else [int(v) for v in sequence_lens.tolist()])
    dirs = list(directions) if directions else [0] * m
    k = ctx.n_outputs - n
    xp = xp_of(*inputs)
    final_states: list[list] = [[] for _ in range(n)]
    scan_outs: list[list] = [[] for _ in range(k)]
    for b in range(batch):
        states = [s[b] for s in states0]
        steps = lens[b]
        elems: list[list] = [[] for _ in range(k)]
        for t in range(steps):
            xs = [s[b, steps - 1 - t if d else t] for s, d in zip(scan_ins, dirs)]
            res = body(*states, *xs)
            states = list(res[:n])
            for j, e in enumerate(res[n:n + k]):
                elems[j].append(e)
        for j, st in enumerate(states):
            final_states[j].append(st)
        for j in range(k):
            if not elems[j]:
                scan_outs[j].append(None)
                continue
            out = _stack("Scan", f"scan output {j}", elems[j])
            if steps < max_len:  # pad to the maximum length (the padding value is undefined)
                pad = xp.zeros((max_len - steps,) + out.shape[1:], dtype=out.dtype)
                out = xp.concatenate([out, pad], axis=0)
            scan_outs[j].append(out)
    outs = [_stack("Scan", f"state {j}", st) for j, st in enumerate(final_states)]
    for j, per_batch in enumerate(scan_outs):
        ref = next((o for o in per_batch if o is not None), None)
        if ref is None:
            outs.append(xp.zeros((batch, max_len), dtype=np.float32))
            continue
        per_batch = [o if o is not None else xp.zeros_like(ref) for o in per_batch]
        outs.append(_stack("Scan", f"scan output {j}", per_batch))
    return _outputs(outs)
