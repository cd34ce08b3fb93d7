"""Training-time fusion of the erf GELU chain that exporters write for ``nn.GELU()``.

torch.onnx (and others before opset 20 had a Gelu op) write GELU as five nodes::

    d = Div(x, sqrt(2)); e = Erf(d); a = Add(e, 1); m = Mul(x, a); y = Mul(m, 0.5)

A training step through the Tensor runner (:class:`~workbench.autodiff.runner.TapeRunner`)
ran five kernels and, in the backward, five gradient rules for it (a BERT-like step at
batch 8 x 32 tokens x 256: ~1.3 ms a layer, the Erf kernel alone ~0.5 ms). Here the chain is
found once per plan in the order the runner saw its steps (:func:`find_chains`) and, from then
on, computed by one compiled GELU call (``transformer.gelu``) with its gradient by one more
(``transformer.gelu_grad``), while **the tape still records the five original nodes** with
their own attributes and constants: ``to_onnx`` writes the graph as it was (each node keeps
its real kernel as ``fn``). A graph-mode replay of a training step (``use_graph=True``:
``TapeRunner.preset``) finds the chains again among its steps and runs them fused, as eager
training does (the same bits); an eval-mode replay runs the nodes' own kernels.

What the five nodes hold: ``y`` is the fused GELU; the three intermediate values ``d``, ``e``,
``a`` and the product ``m`` are not computed - their Tensors hold a read-only NaN array of the
right shape, so any reader the analysis did not foresee gets NaN, never a plausible number.
The analysis only fuses when each intermediate value has exactly one reader, the next node of
the chain, and is freed there (so it is neither a graph output nor read by another node), and
when the three constants hold sqrt(2), 1 and 0.5 (one value each; where one has a higher rank
than ``x`` it broadcasts the output to that rank, which the fused kernel does not: that chain
runs unfused). The constants are Constant nodes or initializers that are no parameters
(torch.onnx's dynamo exporter writes them as 0-d initializers, which ``SONNXModel`` keeps as
constants): the runner's ``leaf_source`` gives the Tensor a plan input slot holds, and the
chain's first step checks in every run that it still holds that value and rank and needs no
gradient (``fuse_attention.guards_hold``; else the run is unfused). The half may come first, as the
dynamo exporter writes it: ``m = Mul(a, 0.5); y = Mul(x, m)`` (``Chain.swapped``; the last
Mul's rule then gives the fused gradient to ``x`` itself). At run time every
step of the chain checks that it receives the Tensor the previous step made (else it runs its
own kernel). The backward: the last Mul's rule is the fused gradient
``g * (Phi(x) + x phi(x))`` for its product input, the first Mul's passes that gradient to
``x`` (TapeNode.grad_rule); Add, Erf and Div receive no gradient. Those rules hold within a
whole ``backward(loss)`` only: a backward of single nodes (SINGA's ``creator.backward``)
of a fused node is refused with a clear error (their inputs were not computed).

Numbers: the compiled GELU's erf is the engine's fitted float32 rational (3.8e-7 absolute
error, the same as the inference plans' fused GELU epilogue), where the chain used the Erf
op's kernel (within 1 ulp of float32); so a fused training step differs from the unfused one
in the last bits of the activations (relative ~1e-7) and of its gradients. Elementwise work
split over threads changes no bit: nothing depends on the thread count. Only float32 host
arrays with the compiled kernels loaded are fused; ``WORKBENCH_FUSE_GELU=0`` turns it off.

:func:`find_chains` also finds the attention cores that :mod:`workbench.autodiff.fuse_attention`
runs fused (``WORKBENCH_FUSE_ATTENTION=0`` turns that off), and :func:`run_step` hands their
steps to it.
"""

from __future__ import annotations

import math
import os

import numpy as np

from workbench.autodiff import fuse_attention
from workbench.autodiff import tape as _tape
from workbench.autodiff.fuse_attention import guards_hold, leaf_value, only_reader

_SQRT2 = np.float32(math.sqrt(2.0))
_PARALLEL_MIN = 1 << 15   # elements under which the gradient kernel runs on this thread
_DIV, _ERF, _ADD, _MUL, _MUL2 = range(5)


def gelu_enabled() -> bool:
    """Whether training steps fuse the GELU chain (``WORKBENCH_FUSE_GELU`` not "0")."""
    return os.environ.get("WORKBENCH_FUSE_GELU", "1").strip() != "0"


def attention_enabled() -> bool:
    """Whether training steps fuse the attention core (``WORKBENCH_FUSE_ATTENTION`` not "0";
    :mod:`workbench.autodiff.fuse_attention`)."""
    return os.environ.get("WORKBENCH_FUSE_ATTENTION", "1").strip() != "0"


def enabled() -> bool:
    """Whether training steps fuse anything (the GELU chain or the attention core)."""
    return gelu_enabled() or attention_enabled()


class Chain:
    """One GELU chain of a plan: its five steps' ids, the positions of the inputs the
    run-time checks read and the highest rank of its three constants (a constant of shape
    (1, 1, 1) broadcasts a rank-2 ``x`` to rank 3: such a chain runs unfused), whether the
    half comes first (``swapped``: dynamo's ``x * ((1 + erf(x / sqrt2)) * 0.5)``), the
    ``guards`` of its constants held by initializers (``fuse_attention.guards_hold``), plus
    the state of the run in progress."""

    __slots__ = ("ids", "pos", "rank", "swapped", "guards", "x", "y", "expect")

    def __init__(self, ids, pos, rank=0, swapped=False, guards=()):
        self.ids, self.pos, self.rank = ids, pos, rank
        self.swapped, self.guards = swapped, guards
        self.x = self.y = self.expect = None


def _const_value(st, calls):
    """``(value, rank)`` of a Constant step holding one float32 value (of any rank: its
    shape is all ones), else None."""
    n = st.node
    if n.op_type != "Constant" or n.domain or len(st.outs) != 1:
        return None
    call = calls.get(id(st))
    if call is None or call.wants_ctx or call.state_outputs:
        return None
    try:
        v = call.fn(**call.kw)
    except Exception:  # noqa: BLE001 - not a constant this analysis can read
        return None
    if not isinstance(v, np.ndarray) or v.size != 1 or v.dtype != np.float32:
        return None
    return float(v.reshape(())), v.ndim


def find_chains(order, calls, leaf_source=None) -> dict:
    """``{id(step): (role, Chain)}`` for the GELU chains among ``order`` (the steps of one
    plan in the order they ran; ``calls``: the runner's prepared calls by step id), and
    ``{id(step): (role, fuse_attention.Core)}`` for the attention cores.

    The constants are those of one value; their ranks are kept beside (``ranks``): a
    constant of a higher rank than the value it scales grows the result's shape, which the
    fused kernels do not, so the run-time checks compare them. They come from Constant nodes
    and, with ``leaf_source`` (``slot -> Tensor or None``: what a plan input slot holds in
    this run, e.g. an imported model's initializers), from the plan's inputs that hold a
    constant (``fuse_attention.leaf_value``): exporters write scalar constants as initializers too
    (torch.onnx's dynamo exporter always). Those may change between runs, so the chains and
    cores that use one keep ``guards`` (``(slot, value, rank)``) that their first step
    checks in every run (``fuse_attention.guards_hold``); where one fails, the run is unfused."""
    readers: dict = {}
    for st in order:
        for k, s in enumerate(st.ins):
            if s >= 0:
                readers.setdefault(s, []).append((st, k))
    consts, ranks = {}, {}
    for st in order:
        v = _const_value(st, calls)
        if v is not None:
            consts[st.outs[0]], ranks[st.outs[0]] = v
    leaves: set = set()
    if leaf_source is not None:
        made = {s for st in order for s in st.outs}
        for s in readers:
            if s not in made and s not in consts:
                v = leaf_value(leaf_source(s))
                if v is not None:
                    consts[s], ranks[s] = v
                    leaves.add(s)

    def guards(*slots):
        return tuple((s, consts[s], ranks[s]) for s in dict.fromkeys(slots) if s in leaves)

    found: dict = {}
    if attention_enabled():
        found.update(fuse_attention.find(order, readers, consts, ranks, guards))
    if not gelu_enabled():
        return found
    for div in order:
        n = div.node
        if n.op_type != "Div" or n.domain or len(div.ins) != 2:
            continue
        x_slot, c_slot = div.ins
        if x_slot < 0 or consts.get(c_slot) != float(_SQRT2):
            continue
        erf, _ = only_reader(readers, div, ("Erf",))
        if erf is None or len(erf.ins) != 1:
            continue
        add, ka = only_reader(readers, erf, ("Add",))
        if add is None or len(add.ins) != 2 or consts.get(add.ins[1 - ka]) != 1.0:
            continue
        mul, km = only_reader(readers, add, ("Mul",))
        if mul is None or len(mul.ins) != 2:
            continue
        # x * (1 + erf) then * 0.5 (TorchScript's order), or (1 + erf) * 0.5 then x * that
        # (the dynamo exporter's)
        swapped = mul.ins[1 - km] != x_slot
        if swapped and consts.get(mul.ins[1 - km]) != 0.5:
            continue
        mul2, k2 = only_reader(readers, mul, ("Mul",))
        if mul2 is None or len(mul2.ins) != 2:
            continue
        if (mul2.ins[1 - k2] != x_slot) if swapped else \
                (consts.get(mul2.ins[1 - k2]) != 0.5):
            continue
        steps = (div, erf, add, mul, mul2)
        if any(id(s) in found for s in steps):
            continue
        half = mul.ins[1 - km] if swapped else mul2.ins[1 - k2]
        rank = max(ranks[c_slot], ranks[add.ins[1 - ka]], ranks[half])
        chain = Chain(tuple(id(s) for s in steps), (ka, km, k2), rank, swapped,
                      guards(c_slot, add.ins[1 - ka], half))
        for role, s in enumerate(steps):
            found[id(s)] = (role, chain)
    return found


def _placeholder(shape):
    """The read-only NaN array an unfused intermediate Tensor holds."""
    return np.broadcast_to(np.float32(np.nan), shape)


def _gelu_forward(x):
    """The compiled erf GELU of float32 ``x``, or None when it is not available."""
    from workbench.ops import rowwise  # noqa: PLC0415 - the ops package imports the tape
    return rowwise.gelu(x, "Gelu")


def gelu_grad(x, g):
    """``g * GELU'(x)`` (float32, x's shape) by the compiled kernel, split over the engine's
    threads from 32k values (elementwise: the split changes no bit); None when the kernel
    is not loaded or the arrays do not fit it."""
    from workbench import compiled  # noqa: PLC0415
    from workbench.compiled import data_pointer  # noqa: PLC0415
    from workbench.ops.parallel import n_workers, run_blocks  # noqa: PLC0415

    k = compiled.kernel("transformer.gelu_grad")
    if k is None or x.dtype != np.float32 or g.dtype != np.float32 or g.shape != x.shape:
        return None
    raw = k.raw
    xc = np.ascontiguousarray(x)
    gc = np.ascontiguousarray(g)
    d = np.empty(x.shape, np.float32)
    n = d.size
    px, pg, pd = data_pointer(xc), data_pointer(gc), data_pointer(d)
    nw = n_workers()
    if n < _PARALLEL_MIN or nw == 1:
        if n:
            raw(px, pg, pd, 0, n)
        return d
    step = -(-n // (2 * nw))
    jobs = [(i, min(n, i + step)) for i in range(0, n, step)]

    def work(chunk):
        for i0, i1 in chunk:
            raw(px, pg, pd, i0, i1)
    run_blocks(np, jobs, work, 1 << 30)
    return d


def _no_gradient(ctx, grads_out, inputs, outputs, **attrs):
    """Div, Erf and Add of a fused chain: their values were not computed, and the chain's
    gradient reaches ``x`` through the Muls (nothing else reads them: :func:`find_chains`)."""
    from workbench.errors import GradientError  # noqa: PLC0415
    raise GradientError(f"{ctx.op_type} node {ctx.node_name!r} of a fused GELU chain received "
                        f"a gradient, which its chain's analysis rules out")


def _pass_to(pos, n_in):
    """The first Mul's rule: the gradient that arrived goes to ``x`` (input ``pos``) as it is
    (it is already GELU's gradient: see :func:`_fused_rule`)."""
    def rule(ctx, grads_out, inputs, outputs, **attrs):
        out = [None] * n_in
        out[pos] = grads_out[0]
        return tuple(out)
    return rule


def _fused_rule(x, pos, n_in):
    """The last Mul's rule: GELU's gradient with respect to ``x`` for its product input."""
    def rule(ctx, grads_out, inputs, outputs, **attrs):
        g = grads_out[0]
        d = gelu_grad(x, g)
        if d is None:   # the kernels were switched off since the forward: numpy
            d = _gelu_grad_numpy(x, g)
        out = [None] * n_in
        out[pos] = d
        return tuple(out)
    return rule


def _gelu_grad_numpy(x, g):
    """``g * GELU'(x)`` in numpy (float32; erf from the engine's Erf kernel)."""
    from workbench.ops.elementwise import erf_array  # noqa: PLC0415
    t = np.float32
    with np.errstate(invalid="ignore", over="ignore"):   # +-Inf: Inf * 0 is NaN, as the chain
        cdf = t(0.5) * (t(1.0) + erf_array(x / _SQRT2))
        pdf = np.exp(t(-0.5) * x * x) * t(1.0 / math.sqrt(2.0 * math.pi))
        return (g * (cdf + x * pdf)).astype(np.float32, copy=False)


def run_step(runner, role, chain, step, call, args):
    """Run ``step`` (role ``role`` of ``chain``) fused; its output Tensor, or None when the
    step must run its own kernel (the chain is then off for this run)."""
    if type(chain) is not Chain:    # an attention core (fuse_attention.Core)
        return chain.run_step(runner, role, step, call, args)
    if role == _DIV:
        chain.x = chain.y = chain.expect = None
        x = args[0]
        if not isinstance(x, _tape.Tensor) or not x.requires_grad \
                or type(x.data) is not np.ndarray or x.data.dtype != np.float32 \
                or x.data.ndim < chain.rank or not _tape._recording.get() \
                or not _tape._grad_enabled.get() \
                or (chain.guards and not guards_hold(runner, chain.guards)):
            return None
        y = _gelu_forward(x.data)
        if y is None:
            return None
        chain.x, chain.y = x, y
        out = _tape.record_given(runner, step, call, args, _placeholder(x.shape))
        out.creator.grad_rule = _no_gradient
    else:
        prev = chain.expect
        if prev is None:
            return None
        ka, km, k2 = chain.pos
        if role == _ERF:
            ok = args[0] is prev
        elif role == _ADD:
            ok = args[ka] is prev
        elif role == _MUL:
            ok = args[km] is prev and (chain.swapped or args[1 - km] is chain.x)
        else:
            ok = args[k2] is prev and (not chain.swapped or args[1 - k2] is chain.x)
        if not ok:
            chain.x = chain.y = chain.expect = None
            return None
        if role == _MUL2:
            # the fused gradient goes to the product input (then the first Mul passes it to
            # x) or, with the half first, straight to x; the other input receives none
            out = _tape.record_given(runner, step, call, args, chain.y)
            out.creator.grad_rule = _fused_rule(chain.x.data, 1 - k2 if chain.swapped else k2,
                                                len(args))
            chain.x = chain.y = chain.expect = None
            return out
        out = _tape.record_given(runner, step, call, args, _placeholder(prev.shape))
        out.creator.grad_rule = _pass_to(1 - km, len(args)) \
            if role == _MUL and not chain.swapped else _no_gradient
    chain.expect = out
    return out


