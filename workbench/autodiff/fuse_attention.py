"""Training-time fusion of the attention core exporters write for scaled dot-product attention.

torch.onnx (and most exporters) write the core of a self-attention layer as::

    S = MatMul(Q, Kt); D = Div(S, c) (or Mul(S, c)); A = Add(D, M); P = Softmax(A, axis=-1)
    O = MatMul(P, V)

with Q (..., Sq, d), Kt (..., d, Sk), V (..., Sk, dv) (rank 3 or 4, equal batch dimensions), a
scalar constant ``c`` and an additive mask M broadcast to the scores, or instead of the Add a
``Where(cond, fill, D)`` / ``Where(cond, D, fill)`` with a boolean condition and a scalar
constant ``fill`` (GPT-2's causal mask); the scale and the mask are each optional. The
constants are Constant nodes or initializers that are no parameters (the dynamo exporter's),
whose value, rank and ``requires_grad`` the first MatMul checks in every run
(:func:`guards_hold`). A training
step through the Tensor runner ran five kernels for it and five gradient rules in the backward
(BERT-like, batch 8 x 4 heads x 32 tokens: ~1.2 ms a layer, the numpy softmax ~0.3 ms and each
stacked product through the general MatMul path ~0.15-0.2 ms). Here the core is found once per
plan (:func:`find`, called by :func:`workbench.autodiff.fusion.find_chains` in the order the
runner saw its steps) and, from the runner's second step on:

- the second MatMul's step makes O and P in one call of the compiled
  ``attention_avx2.attention_probs`` (the inference kernel's loop: scores, scale, mask,
  softmax and the product with V per (batch, head) pair, reading Q, Kt, V and M through their
  strides, so the head split's Transposes cost no copy), P written to the Softmax step's
  output array;
- its rule makes dQ, dKt and dV in one call of ``attention_avx2.attention_grad`` from P and dO
  (dP = dO V^T, dS = P (dP - rowsum(dP P)) then the scale's ``/ c`` or ``* c``, dQ = dS K,
  dKt = Q^T dS, dV = P^T dO), keeps dQ and dKt for the first MatMul's rule, and hands P a NaN
  token that the Softmax, Add and Div/Mul rules pass on unchanged.

**The tape still records the five original nodes** with their own attributes and constants
(``to_onnx`` writes the graph as it was: each node keeps its kernel as ``fn``; a graph-mode
replay of a training step finds the core again and runs it fused, as eager training does).
What they hold: P and O their real values; the scores and the
scaled and masked scores are not computed - their Tensors hold a read-only NaN array, so a
reader the analysis did not foresee gets NaN, never a plausible number. The analysis fuses only
when S, D, A and P each have exactly one reader, the next node of the core, which frees them
there (no graph output, no other reader), P's reader reading it as its first input. At run time
each step checks that it receives the Tensor the previous step made, that the arrays are
float32 host arrays, that the softmax is over the last axis, that the mask needs no gradient,
is float32 (a Where's condition boolean) and broadcasts to the scores without growing them, that
the scale's and the fill's constants (one value, but maybe of shape (1, 1, 1, 1)) are of no
higher rank than the scores, and that the compiled kernels are loaded. Where a check fails the
value the step reads is made from Q and Kt with the same numpy ufuncs as the MatMul, Div/Mul,
Add and Where kernels, and the rest of the core runs unfused; the steps before keep their own
rules (none of them reads a skipped value). The fused rules are set only when the core ran
fused to its end. A backward of single nodes (SINGA's ``creator.backward``) of a fused node is
refused with a clear error (their rules hold within a whole ``backward(loss)`` only). When the
kernels were switched off between the forward and the backward, the rule computes the same
gradients in numpy.

Numbers: the kernels' products are FMA chains in a fixed order and the softmax's exp is the
engine's fitted float32 exp, where the unfused core used BLAS and the compiled row softmax; so
a fused step differs from the unfused one in the last bits of P, O and the gradients (relative
~1e-7; BERT-like losses agree to ~7 digits, the first step's loss is unchanged). Each (batch,
head) pair is computed alone in a fixed order and the calls are not split: nothing depends on
the thread count. ``WORKBENCH_FUSE_ATTENTION=0`` turns it off.
"""

from __future__ import annotations

import numpy as np

from workbench.autodiff import tape as _tape
from workbench.errors import GradientError

_MM1, _SCALE, _MASK, _SOFTMAX, _MM2 = range(5)
_F32 = np.float32
_BLOCKS_MAX = 16   # call blocks a core keeps (one per set of shapes and strides)


class Core:
    """One attention core of a plan: the scale (None, ``("/", c)`` or ``("*", c)``), the input
    positions the run-time checks read, and the run in progress."""

    __slots__ = ("scale", "pos", "fill", "rank", "guards", "c", "passes", "q", "k", "s", "p",
                 "mask", "softmax", "expect", "nodes", "blocks")

    def __init__(self, scale, pos, fill=None, rank=0, guards=()):
        # fill: None (an additive mask, or none), or (mode, value) for a Where that puts the
        # scalar ``value`` where its condition is true (mode 2) or false (mode 3); rank: the
        # highest rank of the scale's and the fill's constants (one of a higher rank than the
        # scores would grow their shape: such a core runs unfused)
        self.scale, self.pos, self.fill, self.rank = scale, pos, fill, rank
        # the scale's and the fill's constants held by initializers: (slot, value, rank),
        # checked by the first MatMul in every run (guards_hold)
        self.guards = guards
        # the scale's constant as the float32 the kernels compute with
        self.c = None if scale is None else _F32(scale[1])
        self.passes = (_pass_rule(pos[0]), _pass_rule(pos[1]), _pass_rule(0))
        self.blocks = {}   # the kernels' call blocks by the arrays' shapes and strides
        self.off()

    def off(self):
        self.q = self.k = self.s = self.p = self.mask = self.softmax = self.expect = None
        self.nodes = []

    def run_step(self, runner, role, step, call, args):
        """Run ``step`` (role ``role``) fused; its output Tensor, or None when the step must
        run its own kernel."""
        try:
            return _run(self, runner, role, step, call, args)
        except Exception:
            self.off()
            raise


def only_reader(readers, st, ops):
    """``(step, input position)`` of the one step reading ``st``'s single output, if its op
    type is one of ``ops`` (default domain), it has one output and it frees that value (so
    the value is no graph output and read by nothing else); else ``(None, -1)``.
    ``readers``: ``{slot: [(step, input position), ...]}``. The GELU chains of
    :mod:`~workbench.autodiff.fusion` are found with it too."""
    if len(st.outs) != 1 or st.outs[0] < 0:
        return None, -1
    r = readers.get(st.outs[0], ())
    if len(r) != 1:
        return None, -1
    nxt, k = r[0]
    n = nxt.node
    if n.op_type not in ops or n.domain or st.outs[0] not in nxt.free or len(nxt.outs) != 1:
        return None, -1
    return nxt, k


def find(order, readers, consts, ranks=None, guards=None) -> dict:
    """``{id(step): (role, Core)}`` for the attention cores among ``order`` (``readers``:
    ``{slot: [(step, input position), ...]}``; ``consts``: ``{slot: float}`` of the float32
    constants of one value, ``ranks``: ``{slot: rank}`` of their arrays, 0 where missing;
    ``guards(*slots)``: the run-time checks of those of the slots that initializers hold,
    :func:`workbench.autodiff.fusion.find_chains`)."""
    ranks = ranks or {}

    found: dict = {}
    for mm1 in order:
        n = mm1.node
        if n.op_type != "MatMul" or n.domain or len(mm1.ins) != 2 or min(mm1.ins) < 0:
            continue
        steps, scale, pos, rank, held = [mm1], None, [-1, -1, -1], 0, []
        nxt, k = only_reader(readers, mm1, ("Div", "Mul", "Add", "Where", "Softmax"))
        if nxt is not None and nxt.node.op_type in ("Div", "Mul"):
            if len(nxt.ins) != 2 or (nxt.node.op_type == "Div" and k != 0):
                continue
            c = consts.get(nxt.ins[1 - k])
            if c is None:
                continue
            scale = ("/" if nxt.node.op_type == "Div" else "*", c)
            rank = ranks.get(nxt.ins[1 - k], 0)
            held.append(nxt.ins[1 - k])
            steps.append(nxt)
            pos[0] = k
            nxt, k = only_reader(readers, nxt, ("Add", "Where", "Softmax"))
        else:
            steps.append(None)
        fill = None
        if nxt is not None and nxt.node.op_type == "Add":
            if len(nxt.ins) != 2 or nxt.ins[1 - k] < 0:
                continue
            steps.append(nxt)
            pos[1] = k
            nxt, k = only_reader(readers, nxt, ("Softmax",))
        elif nxt is not None and nxt.node.op_type == "Where":
            # Where(cond, fill, scores) / Where(cond, scores, fill), fill a scalar Constant
            if len(nxt.ins) != 3 or k == 0 or nxt.ins[0] < 0:
                continue
            value = consts.get(nxt.ins[3 - k])
            if value is None:
                continue
            fill = (2 if k == 2 else 3, value)
            rank = max(rank, ranks.get(nxt.ins[3 - k], 0))
            held.append(nxt.ins[3 - k])
            steps.append(nxt)
            pos[1] = k
            nxt, k = only_reader(readers, nxt, ("Softmax",))
        else:
            steps.append(None)
        if nxt is None or nxt.node.op_type != "Softmax" or len(nxt.ins) != 1:
            continue
        steps.append(nxt)
        mm2, k = only_reader(readers, nxt, ("MatMul",))
        if mm2 is None or k != 0 or len(mm2.ins) != 2 or mm2.ins[1] < 0:
            continue
        steps.append(mm2)
        if any(s is not None and id(s) in found for s in steps):
            continue
        core = Core(scale, tuple(pos), fill, rank,
                    guards(*held) if guards is not None and held else ())
        for role, s in enumerate(steps):
            if s is not None:
                found[id(s)] = (role, core)
    return found


def leaf_value(t):
    """``(value, rank)`` of a Tensor that can stand for a constant of one float32 value: a
    host float32 array of one element that needs no gradient and has no creator (an
    initializer that is no parameter, a replay's leaf); else None."""
    if not isinstance(t, _tape.Tensor) or t.requires_grad or t.creator is not None:
        return None
    a = t.data
    if type(a) is not np.ndarray or a.size != 1 or a.dtype != np.float32:
        return None
    return float(a.reshape(())), a.ndim


def guards_hold(runner, guards) -> bool:
    """Whether every ``(slot, value, rank)`` of ``guards`` still holds: the Tensor that the
    runner's ``leaf_source`` gives for the slot (the one the step will read in this run) is
    a constant (:func:`leaf_value`) of that value and rank. Checked by a chain's or a core's
    first step: the fused kernels bake the value in, and a parameter (``requires_grad``)
    would need a gradient they do not make."""
    src = runner.leaf_source
    if src is None:
        return False
    for slot, value, rank in guards:
        v = leaf_value(src(slot))
        if v is None or v[0] != value or v[1] != rank:
            return False
    return True


def _placeholder(shape):
    """The read-only NaN array a value the fused core skips holds (one per shape, shared:
    nothing can write it)."""
    a = _PLACEHOLDERS.get(shape)
    if a is None:
        if len(_PLACEHOLDERS) >= 64:
            _PLACEHOLDERS.clear()
        a = _PLACEHOLDERS[shape] = np.broadcast_to(_F32(np.nan), shape)
    return a


_PLACEHOLDERS: dict = {}


def _host_f32(t) -> bool:
    return isinstance(t, _tape.Tensor) and type(t.data) is np.ndarray \
        and t.data.dtype == _F32


def _stacked(a, b) -> bool:
    """Both of one rank >= 3 with equal batch dimensions and a shared inner dimension."""
    return a.ndim == b.ndim >= 3 and a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2]


def _scores(core):
    """``Q @ Kt`` (made only when a check fails after the fused core skipped it)."""
    if core.s is None:
        core.s = np.matmul(core.q, core.k)
    return core.s


def _prev_value(core, role):
    """The value of the output the step of ``role`` reads, which the fused core skipped,
    made with the same ufuncs as the Div/Mul and Add kernels."""
    d = _scores(core)
    if role == _SCALE:
        return d
    if core.scale is not None:
        d = np.divide(d, core.c) if core.scale[0] == "/" else np.multiply(d, core.c)
    if role == _MASK or core.mask is None:
        return d
    if core.fill is not None:   # Where, as its kernel: the fill where the condition says
        f = _F32(core.fill[1])
        return np.where(core.mask, f, d) if core.fill[0] == 2 else np.where(core.mask, d, f)
    return np.add(d, core.mask) if core.pos[1] == 0 else np.add(core.mask, d)


def _kernel(name):
    from workbench import compiled  # noqa: PLC0415 - compiled imports the ops package
    return compiled.kernel(name)


def _call(fn, wants_ctx, kw, arrays):
    return fn(*arrays, **kw, ctx=None) if wants_ctx else fn(*arrays, **kw)


def _run(core, runner, role, step, call, args):
    if role == _MM1:
        core.off()
        q, k = args
        if not (_host_f32(q) and _host_f32(k)) or not (q.requires_grad or k.requires_grad) \
                or not _stacked(q.data, k.data) or q.data.ndim > 4 or q.data.ndim < core.rank \
                or not _tape._recording.get() or not _tape._grad_enabled.get() \
                or _kernel("attention_avx2.attention_probs") is None \
                or (core.guards and not guards_hold(runner, core.guards)):
            return None
        core.q, core.k = q.data, k.data
        out = _tape.record_given(runner, step, call, args, _placeholder(_score_shape(core)))
        core.nodes.append((role, out.creator))
        core.expect = out
        return out
    prev = core.expect
    if prev is None:
        return None
    shape = _score_shape(core)
    if role == _SCALE:
        if args[core.pos[0]] is not prev:
            return _unfuse(core, runner, step, call, args, role)
        out = _tape.record_given(runner, step, call, args, _placeholder(shape))
    elif role == _MASK:
        kx = core.pos[1]
        m = args[0 if core.fill is not None else 1 - kx]
        md = getattr(m, "data", m)
        if args[kx] is not prev or type(md) is not np.ndarray \
                or md.dtype != (np.bool_ if core.fill is not None else _F32) \
                or (isinstance(m, _tape.Tensor) and m.requires_grad) \
                or md.ndim > len(shape) or _broadcast(md.shape, shape) != shape:
            return _unfuse(core, runner, step, call, args, role)
        core.mask = md
        out = _tape.record_given(runner, step, call, args, _placeholder(shape))
    elif role == _SOFTMAX:
        axis = call.kw.get("axis", -1 if step.opset >= 13 else 1)
        if args[0] is not prev or axis not in (-1, len(shape) - 1):
            return _unfuse(core, runner, step, call, args, role)
        # the probabilities: written by the second MatMul's kernel call (this step's one
        # reader, next), or from the skipped values if that cannot run fused
        core.p = np.empty(shape, _F32)
        core.softmax = (call.fn, call.wants_ctx, call.kw)
        out = _tape.record_given(runner, step, call, args, core.p)
    else:   # the second MatMul
        v = args[1]
        o = None
        if args[0] is prev and _host_f32(v) and _stacked(core.p, v.data):
            o = _forward_c(core, v.data)
        if o is None:
            return _unfuse(core, runner, step, call, args, role)
        out = _tape.record_given(runner, step, call, args, o)
        # the whole core's gradient at this node; the steps before pass on a token to the
        # first MatMul, which hands out what this rule left (set now that the core ran
        # fused to the end: until then their own rules are the right ones)
        stash = []
        fill_mask, fill_mode = (None, 0) if core.fill is None else (core.mask, core.fill[0])
        out.creator.grad_rule = _core_rule(core.q, core.k, core.c, core.scale, stash,
                                           fill_mask, fill_mode)
        for r, node in core.nodes:
            node.grad_rule = _scores_rule(stash) if r == _MM1 else core.passes[r - 1]
        core.off()
        return out
    core.nodes.append((role, out.creator))
    core.expect = out
    return out


def _score_shape(core):
    return core.q.shape[:-1] + core.k.shape[-1:]


def _broadcast(a, b):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


def _unfuse(core, runner, step, call, args, role):
    """A check failed at ``step``: the value it reads that the core skipped is made as the
    kernels make it and the core runs unfused from here. The steps before keep their own
    rules, which read no skipped value (MatMul reads its inputs, Div/Mul by a constant and Add
    only the gradient)."""
    prev = core.expect
    try:
        if role == _MM2:
            if core.p is not None:
                if args[0] is prev:   # the probabilities, as Softmax makes them
                    fn, wants_ctx, kw = core.softmax
                    np.copyto(core.p, _call(fn, wants_ctx, kw, [_prev_value(core, _SOFTMAX)]))
                else:                 # read by nothing: NaN, never a plausible number
                    core.p.fill(np.nan)
            return None
        if not any(a is prev for a in args):
            return None
        value = _prev_value(core, role)
        arrays = [value if a is prev else getattr(a, "data", a) for a in args]
        return _tape.record_given(runner, step, call, args, _call(call.fn, call.wants_ctx, call.kw,
                                                        arrays))
    finally:
        core.off()


# ----------------------------------------------------------------------------- the C kernels
def _elem_strides(a):
    """``a``'s element strides padded in front to (batch, head, row, column), 0 where a
    dimension has size 1; None when a stride is not whole elements."""
    item = a.itemsize
    if any(st % item for st in a.strides):
        return None
    st = [0 if d == 1 else s // item for d, s in zip(a.shape, a.strides)]
    return [0] * (4 - len(st)) + st


def _forward_c(core, v):
    """``O = P @ V`` with the probabilities written into ``core.p``, by the compiled
    ``attention_avx2.attention_probs``; None when it does not take the call."""
    from workbench import compiled  # noqa: PLC0415
    from workbench.compiled.kernels import attention_avx2 as spec  # noqa: PLC0415
    kern = compiled.kernel("attention_avx2.attention_probs")
    q, k, m = core.q, core.k, core.mask
    if kern is None:
        return None
    key = (q.shape, q.strides, k.strides, v.shape, v.strides,
           None if m is None else (m.shape, m.strides))
    bound = core.blocks.get(key)
    if bound is None:
        if len(core.blocks) >= _BLOCKS_MAX:   # shapes that come and go (sequence lengths)
            core.blocks.clear()
        bound = core.blocks[key] = _bind_forward(core, spec, q, k, v, m)
    if bound is False:
        return None
    blk, work, o_shape = bound
    o = np.empty(o_shape, _F32)
    dp = compiled.data_pointer
    blk[0], blk[1], blk[2] = dp(q), dp(k), dp(v)
    # every address is set per call, the scratch's too: a copied core (copy.deepcopy of its
    # runner) gets new scratch arrays, and a block keeping the address of the original's
    # scratch would have the kernel write into memory the copy does not own
    blk[3] = dp(work) if m is None else dp(m)
    blk[4], blk[5], blk[38] = dp(o), dp(work), dp(core.p)
    kern.raw(dp(blk))
    return o


def _bind_forward(core, spec, q, k, v, m):
    """The call block (all addresses filled per call) of :func:`_forward_c` for these shapes
    and strides, its scratch and the output's shape; False when the kernel does not take
    them."""
    sq, sk, sv = _elem_strides(q), _elem_strides(k), _elem_strides(v)
    shape = _score_shape(core)
    sm = [0, 0, 0, 0] if m is None else _elem_strides(np.broadcast_to(m, shape))
    if None in (sq, sk, sv, sm):
        return False
    Sq, D = q.shape[-2:]
    Sk, Dv = k.shape[-1], v.shape[-1]
    if 0 in (Sq, D, Sk, Dv):
        return False
    wf = spec.work_floats(Sq, Sk, D, Dv)
    if wf > 1 << 22:
        return False
    B, H = ((1, 1) + q.shape[:-2])[-2:]
    o_shape = q.shape[:-1] + (Dv,)
    so = [H * Sq * Dv, Sq * Dv, Dv, 1]
    mode = 0 if core.scale is None else (2 if core.scale[0] == "/" else 1)
    blk = np.zeros(len(spec.BLOCK) + 1, np.int64)
    mask_mode = 0 if m is None else (1 if core.fill is None else core.fill[0])
    fill = 0.0 if core.fill is None else float(core.fill[1])
    blk[6:33] = [H, Sq, Sk, D, Dv] + sq + sk + sv + so + sm + [mode, mask_mode]
    blk[33:36] = (0, B * H, min(Sq, spec.ROWS))
    blk[36:38].view(np.float64)[:] = (float(core.c if core.c is not None else 1.0), fill)
    return blk, np.empty(wf, _F32), o_shape


def _data(a):
    from workbench.compiled import data_pointer  # noqa: PLC0415
    return data_pointer(a)


def _grad_c(p, g, q, k, v, c, scale, fill_mask=None, fill_mode=0):
    """``(dQ, dKt, dV)`` by the compiled ``attention_avx2.attention_grad``, or None when it
    is not loaded or does not take the arrays. ``fill_mask``: a Where's boolean condition
    (``fill_mode`` 2: filled where true, 3: where false), whose filled scores take no
    gradient."""
    from workbench.compiled.kernels import attention_avx2 as spec  # noqa: PLC0415
    kern = _kernel("attention_avx2.attention_grad")
    if kern is None or type(g) is not np.ndarray or g.dtype != _F32 \
            or g.shape != p.shape[:-1] + v.shape[-1:] or not p.flags.c_contiguous:
        return None
    sg, sq, sk, sv = (_elem_strides(a) for a in (g, q, k, v))
    sm = [0, 0, 0, 0] if fill_mask is None else \
        _elem_strides(np.broadcast_to(fill_mask, p.shape))
    if None in (sg, sq, sk, sv, sm):
        return None
    Sq, D = q.shape[-2:]
    Sk, Dv = k.shape[-1], v.shape[-1]
    B, H = ((1, 1) + q.shape[:-2])[-2:]
    dq, dk, dv = (np.empty(a.shape, _F32) for a in (q, k, v))
    work = np.empty(spec.grad_work_floats(Sq, Sk, D, Dv), _F32)
    mode = 0 if scale is None else (2 if scale[0] == "/" else 1)
    blk = np.zeros(len(spec.GRAD_BLOCK), np.int64)
    blk[:9] = [_data(a) for a in (p, g, q, k, v, dq, dk, dv, work)]
    blk[9:32] = [H, Sq, Sk, D, Dv] + sg + sq + sk + sv + [mode, 0]
    blk[32] = B * H
    blk[33:34].view(np.float64)[0] = float(c if c is not None else 1.0)
    if fill_mask is not None:
        blk[34] = _data(fill_mask)
        blk[35:40] = sm + [fill_mode]
    kern.raw(_data(blk))
    return dq, dk, dv


def _grad_numpy(p, g, q, k, v, c, scale, fill_mask=None, fill_mode=0):
    """``(dQ, dKt, dV)`` in numpy (the kernels were switched off since the forward): the
    Softmax, Where, Div/Mul and MatMul rules' arithmetic."""
    dv = np.matmul(p.swapaxes(-1, -2), g)
    dp = np.matmul(g, v.swapaxes(-1, -2))
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if fill_mask is not None:
        zero = _F32(0)
        ds = np.where(fill_mask, zero, ds) if fill_mode == 2 else np.where(fill_mask, ds, zero)
    if scale is not None:
        ds = ds / c if scale[0] == "/" else ds * c
    return np.matmul(ds, k.swapaxes(-1, -2)), np.matmul(q.swapaxes(-1, -2), ds), dv


def _core_rule(q, k, c, scale, stash, fill_mask=None, fill_mode=0):
    """The second MatMul's rule: dV for V, and dQ, dKt left in ``stash`` for the first
    MatMul's rule; P receives a NaN token (the Softmax, mask and scale rules pass it on)."""
    def rule(ctx, grads_out, inputs, outputs, **attrs):
        g = grads_out[0]
        if g is None:
            stash.append(None)
            return None, None
        p, v = inputs
        r = _grad_c(p, g, q, k, v, c, scale, fill_mask, fill_mode)
        if r is None:
            r = _grad_numpy(p, g, q, k, v, c, scale, fill_mask, fill_mode)
        stash.append(r[:2])
        need = ctx.needs_input_grad
        return (_placeholder(p.shape) if need[0] else None), (r[2] if need[1] else None)
    return rule


def _scores_rule(stash):
    """The first MatMul's rule: the dQ, dKt the core's rule left."""
    def rule(ctx, grads_out, inputs, outputs, **attrs):
        if not stash:
            raise GradientError(f"MatMul node {ctx.node_name!r} of a fused attention core "
                                f"received a gradient before its core's second MatMul made "
                                f"it (workbench.autodiff.fuse_attention)")
        r = stash.pop()
        if r is None:
            return None, None
        need = ctx.needs_input_grad
        return (r[0] if need[0] else None), (r[1] if need[1] else None)
    return rule


def _pass_rule(pos):
    """Softmax, the mask Add / Where and the scale: the token that arrived goes on to input
    ``pos``; a Constant scale or fill, a condition and a mask that needs no gradient receive
    none (a Where's zeros at the filled scores are made by the core's rule)."""
    def rule(ctx, grads_out, inputs, outputs, **attrs):
        if ctx.op_type == "Softmax":
            return (grads_out[0],)
        out = [None] * len(inputs)
        out[pos] = grads_out[0]
        return tuple(out)
    return rule
