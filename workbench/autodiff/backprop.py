"""Back-propagation over the tape: :func:`backward` and :func:`gradients`.

``backward(loss)`` walks the tape in reverse topological order, accumulates the gradients,
stores them on the leaf Tensors that require one (``t.grad``, replaced - not accumulated - by
each backward), frees the saved arrays, and returns the list of ``(leaf, grad)`` pairs. Each
node's gradients come from its op's rule (``workbench.autodiff.rules``, :func:`run_rule`).
"""

from __future__ import annotations

from workbench.arrays import xp_of
from workbench.autodiff import rules
from workbench.autodiff.tape import TapeNode, Tensor, tape_order
from workbench.errors import GradientError, InputError
from workbench.ops.parallel import deferred_products, one_blas_thread, settle


def backward(y: Tensor, dy=None, *, retain_graph: bool = False) -> list:
    """Back-propagate from ``y``; returns ``[(leaf Tensor, grad Tensor), ...]``.

    ``dy`` defaults to ones of ``y``'s shape (a scalar loss gives the usual gradient). Each leaf
    Tensor that requires a gradient gets ``.grad`` set. The saved arrays are freed unless
    ``retain_graph``; a second backward through freed nodes raises :class:`GradientError`.
    """
    if not isinstance(y, Tensor):
        raise InputError(f"backward() needs a Tensor, got {type(y).__name__}")
    if y.creator is None or not y.requires_grad:
        raise GradientError(
            "backward(): the loss does not depend on any Tensor that requires a gradient "
            "(all parameters frozen, computed inside no_grad()/inference_mode() or by a model "
            "compiled with is_train=False and not switched to model.train(), or the loss is "
            "a constant)")
    xp = xp_of(y.data)
    if dy is None:
        g0 = xp.ones(y.shape, dtype=y.dtype)
    else:
        g0 = dy.data if isinstance(dy, Tensor) else xp.asarray(dy, dtype=y.dtype)
        if g0.shape != tuple(y.shape):
            g0 = xp.broadcast_to(g0, y.shape)
    if xp.__name__ == "numpy":
        # the rules' small products are one BLAS call each and the large ones are split
        # over the engine's own threads: BLAS' own threads would only spin between them (a
        # BERT-like step at 2 threads: 3x the CPU time of one BLAS thread)
        # (weight-gradient products may run on the BLAS worker meanwhile: all finished when
        # deferred_products ends, before the gradients are returned; ops.parallel)
        with one_blas_thread(), deferred_products():
            return _backward(y, g0, retain_graph)
    return _backward(y, g0, retain_graph)


def _backward(y: Tensor, g0, retain_graph: bool) -> list:
    # a gradient waiting for node output ``(node, index)`` is kept under that pair: the very
    # tuple a child's ``parents`` holds (no key built per edge)
    grads: dict = {(y.creator, y._index): g0}
    leaf: dict = {}
    order = tape_order([y], only_grad=True)
    pop = grads.pop
    get = grads.get
    found: dict = {}   # (op type, domain, array module) -> rule, for this backward
    for node in reversed(order):
        if node.n_outputs == 1:
            g = pop((node, 0), None)
            if g is None:
                continue
            gouts = [g]
        else:
            gouts = [pop((node, i), None) for i in range(node.n_outputs)]
            if all(g is None for g in gouts):
                continue
        if node.saved_in is None:
            raise GradientError(
                f"node {node.name!r} ({node.op_type}): its saved arrays were freed by an earlier "
                f"backward(); run the forward again (or pass retain_graph=True)")
        gins = _run_rule(node, gouts, None, found)
        needs = node.needs_input_grad
        n_gins = len(gins)
        i = -1
        for p in node.parents:
            i += 1
            if p is None or i >= n_gins or not needs[i]:
                continue
            g = gins[i]
            if g is None:
                continue
            if type(p) is tuple:
                shape, dtype = p[0].out_meta[p[1]]
            else:
                shape, dtype = tuple(p.shape), p.dtype
            gshape = g.shape
            if gshape != shape and tuple(gshape) != shape:
                raise GradientError(
                    f"node {node.name!r} ({node.op_type}): the gradient rule returned shape "
                    f"{list(gshape)} for input {i}, which has shape {list(shape)}")
            if g.dtype != dtype:
                g = g.astype(dtype)
            if type(p) is tuple:
                prev = get(p)
                grads[p] = g if prev is None else prev + g
            else:
                prev = leaf.get(id(p))
                if prev is not None:
                    settle()   # a product queued on the BLAS worker is read here
                leaf[id(p)] = (p, g if prev is None else prev[1] + g)
        if not retain_graph:
            node.saved_in = node.saved_out = None
            node.freed = True
        # the locals would keep this node's gradients alive during the next node's rule
        gouts = gins = g = prev = None
    out = []
    for t, g in leaf.values():
        gt = Tensor._make(g, t.device, False, None, 0, None)
        t.grad = gt
        out.append((t, gt))
    return out


def run_rule(node: TapeNode, gouts: list, needs: tuple | None = None) -> tuple:
    """The gradients of ``node``'s inputs for its output gradients ``gouts`` (arrays, None
    where no gradient arrived): its op's rule (the override for the arrays' module first)
    applied to the arrays the node saved. ``needs`` replaces ``node.needs_input_grad`` (a
    backward of single nodes: refused for the nodes of a fused chain, whose ``grad_rule`` is
    only right within a whole backward)."""
    return _run_rule(node, gouts, needs, None)


def _run_rule(node: TapeNode, gouts: list, needs: tuple | None, found: dict | None) -> tuple:
    """:func:`run_rule`; ``found`` (a backward's) remembers the rules looked up so far."""
    xp = xp_of(*node.saved_in)
    rule = node.grad_rule   # a node's own rule (a fused chain's), else its op's
    if rule is not None and needs is not None:
        raise GradientError(
            f"node {node.name!r} ({node.op_type}) ran fused with its GELU chain or attention "
            f"core in a training step (workbench.autodiff.fusion): its own inputs were not "
            f"kept, so it has no backward of its own; differentiate through backward(loss), or "
            f"set WORKBENCH_FUSE_GELU=0 / WORKBENCH_FUSE_ATTENTION=0 before the training step")
    if rule is None:
        if found is None:
            rule = rules.rule_for(node.op_type, node.domain, xp=xp)  # the device's override first
        else:
            key = (node.op_type, node.domain, xp)
            rule = found.get(key)
            if rule is None:
                rule = found[key] = rules.rule_for(node.op_type, node.domain, xp=xp)
    if rule is None:
        dom = node.domain or "ai.onnx"
        raise GradientError(
            f"node {node.name!r} ({dom}::{node.op_type}, opset {node.opset}) has no gradient "
            f"rule, but a gradient flows through it to a trainable parameter; freeze the "
            f"parameters before it (Tensor.requires_grad = False / model.freeze()), cut the "
            f"model before it, or add a rule with "
            f"@workbench.autodiff.rules.gradient({node.op_type!r})")
    ctx = rules.GradContext(node.op_type, node.opset,
                            node.needs_input_grad if needs is None else needs, xp, node.name,
                            node.n_outputs, node.parents)
    kw = node.kw
    if node.training_mode:
        kw = dict(kw)
        kw["training"] = True
    try:
        gins = rule(ctx, gouts, node.saved_in, node.saved_out, **kw)
    except GradientError:
        raise
    except Exception as e:
        raise GradientError(f"node {node.name!r} ({node.op_type}): gradient rule failed: "
                            f"{type(e).__name__}: {e}") from e
    return tuple(gins) if gins is not None else ()


class _Gradients(dict):
    """``{leaf Tensor: grad}``; SINGA's code looks the gradients up by ``id(tensor)``, which
    works too."""

    def __missing__(self, key):
        if isinstance(key, int):
            for t, g in self.items():
                if id(t) == key:
                    return g
        raise KeyError(key)

    def __contains__(self, key):
        return dict.__contains__(self, key) or (
            isinstance(key, int) and any(id(t) == key for t in self))


def gradients(y: Tensor, dy=None) -> dict:
    """``{leaf Tensor: grad Tensor}`` for every leaf requiring a gradient (SINGA's API; the
    keys may also be given as ``id(tensor)``, as SINGA's code does)."""
    return _Gradients(backward(y, dy))
