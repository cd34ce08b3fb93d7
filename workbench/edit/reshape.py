"""Re-shape and re-batch that work on real exports.

Exporters bake shapes into constants: torch.onnx with a fixed example input folds
``x.view(x.size(0), -1)`` into ``Reshape(x, [1, 512])``, an attention head split into
``Reshape(q, [1, 8, 4, 16])``, ``torch.arange(seq)`` into a constant ``[0 .. 7]``. Changing the
declared input shape then breaks the model at the first such node (onnx/onnx#3483, #2182).

How this module finds and rewrites them:

1. Every input dim that changes, or that is symbolic, is a *symbol* with two probe values: its
   old size (A) and a different one (B: the new size, or a probe when the new dim is a name).
2. The graph is evaluated node by node at A and at B at once (``evaluate.Evaluator``). Each dim
   of each value then has a *signature* (its size at A, at B): unchanged, or an expression
   ``c x (product of symbols)`` found by matching the two sizes (that is the shape arithmetic,
   followed through every op by running it).
3. Before each node runs at B, rules look at what it was given:

   - ``Reshape``: the old input and output shapes are aligned (groups of axes with equal
     products); a group whose input axes changed gets its new size from the input's runtime
     shape (``Shape -> Gather [-> Mul/Div] -> Concat``), the rest stay constants. A merged
     batch x sequence axis split again is split by the symbols it carries.
   - ``Expand``: a target entry that copied the input's old size becomes 1 (broadcast).
   - ``Slice``: an end that reached the old end of an axis that grew reaches the new end.
   - ``Resize``: fixed ``sizes`` become the input's runtime size times the old ratio.
   - ops that need equal dims (broadcasting ops, ``Concat``, ``MatMul``): an input dim that
     kept its old size where the others changed is traced back (through elementwise ops,
     Transpose, (Un)Squeeze, Gather, Cast...) to the constant that fixed it (an ``Expand`` /
     ``Tile`` / ``ConstantOfShape`` / ``Reshape`` target, ``Range`` limit, ``Slice`` end, or a
     constant ``arange``), which is rewritten from the symbol's runtime size.

   Each rewrite is replayed at A: the rewritten model must compute exactly what the original
   did at the old shape, or the edit is refused.
4. The new dims are declared, the outputs' dims follow their signatures, and the session's
   check compares the edited model with the original: at the old shape (same outputs), and for
   a batch change sample by sample at the new batch size (and at a second one when the batch is
   symbolic): row i of the new model's output must equal the original's output for sample i.

What cannot be made generic is refused with the node and the reason: a constant tensor whose
data was computed from the old shape (GPT-2's position embeddings folded for 8 positions), a
split of an axis whose parts cannot be told apart.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from workbench.edit.edits import order_fix
from workbench.edit.errors import EditError
from workbench.edit.evaluate import Evaluator, NodeFailed
from workbench.edit.registry import edit
from workbench.edit.state import Draft, node_label, set_shape, shape_of
from workbench.edit.verify import KEEPS, Intent, error_text

INT64_MAX = np.iinfo(np.int64).max
#: at most this many rewrites per edit (a safety net against a rule that keeps firing)
MAX_REWRITES = 2000
#: rewrites listed in a step's notes (all of them are in ``step.rewrites``)
SHOWN_REWRITES = 12


def _broadcasting_ops() -> frozenset:
    """Ops with numpy-style broadcasting, read from the installed onnx's schemas."""
    out = set()
    for s in onnx.defs.get_all_schemas():
        if s.domain == "" and "multidirectional" in (s.doc or "").lower():
            out.add(s.name)
    return frozenset(out)


BROADCASTING = _broadcasting_ops()


@dataclass
class Sym:
    """A changing input dim: its sizes in the probe configurations (A = old, B = new, C = a
    third probe when two symbols change alike), its target, where it is read."""

    index: int
    a: int
    b: int
    target: object            # int, str or None
    source: tuple             # (input name, axis): where the rewrites read it
    label: str
    uses: list = field(default_factory=list)   # every (input, axis) with this dim
    c: int = 0

    def val(self, config: str) -> int:
        return {"A": self.a, "B": self.b, "C": self.c or self.b}[config]


@dataclass
class Rewrite:
    node: str
    op: str
    what: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op}): {self.what}"


@dataclass
class _Piece:
    kind: str                 # "const" | "data" | "sym"
    value: int = 0
    axes: tuple = ()
    div: int = 1
    sym: Sym | None = None
    mul: int = 1


class Reshaper:
    def __init__(self, d: Draft, ctx, targets: dict):
        self.d, self.ctx = d, ctx
        self.targets = targets
        self.rewrites: list[Rewrite] = []
        self.syms: list[Sym] = []
        self.shape_cache: dict = {}
        self.gather_cache: dict = {}
        self.orig_a: dict = {}
        self._conflicts: set = set()
        if (d.opset("") or 0) < 7:
            raise EditError(f"re-shaping needs ai.onnx opset 7 or newer (the model has "
                            f"{d.opset('')}); set_opset first")

    # ------------------------------------------------------------------ symbols and probes
    def plan_symbols(self) -> dict:
        """Symbols for the input dims; returns the feeds of each probe configuration."""
        d, samples = self.d, self.ctx.checker.samples
        m = d.state().stub()
        taken_b: set = set()
        bykey: dict = {}
        plan = []   # (k, vi, [per axis: int | Sym])
        for k, vi in enumerate(v for v in d.g.input if v.name not in d.inits):
            old = shape_of(vi)
            new = self.targets.get(vi.name, old)
            if old is None:
                raise EditError(f"input {vi.name!r} has no declared rank; declare its dims "
                                f"first (set_dims)")
            dims = []
            for ax, (o, n) in enumerate(zip(old, new)):
                a = o if isinstance(o, int) and o > 0 else samples.dim_size(o, ax)
                if isinstance(o, int) and o > 0 and o == n:
                    dims.append(a)
                    continue
                key = (o if isinstance(o, (int, str)) else ("?", vi.name, ax), n)
                sym = bykey.get(key)
                if sym is None:
                    b = n if isinstance(n, int) and n > 0 else self._probe(a, ax, taken_b)
                    label = n if isinstance(n, str) else (o if isinstance(o, str) else
                                                          f"{vi.name}[{ax}]")
                    sym = Sym(len(self.syms), a, b, n, (vi.name, ax), str(label))
                    self.syms.append(sym)
                    bykey[key] = sym
                sym.uses.append((vi.name, ax))
                taken_b.add(sym.b)
                dims.append(sym)
            plan.append((k, vi, dims))
        if not self.syms:
            raise EditError("nothing changes: the new shapes are the old ones")
        configs = ["A", "B"]
        if _ambiguous([(s.a, s.b) for s in self.syms]):
            # two symbols change by the same ratio: a third probe tells them apart
            used: set = set()
            for s in self.syms:
                free = not isinstance(s.target, int) or s.source[1] == 0
                s.c = self._probe(s.a, s.source[1], used | {s.b}) if free else s.b
                used.add(s.c)
            if _ambiguous([(s.a, s.b, s.c) for s in self.syms]):
                raise EditError(
                    "the changed dims " + ", ".join(f"{s.label} ({s.a} -> {s.b})"
                                                    for s in self.syms)
                    + " change by the same ratio, so the graph cannot tell their sizes apart; "
                      "change them in two steps")
            configs.append("C")
        self.configs = configs
        feeds = {c: {} for c in configs}
        for k, vi, dims in plan:
            for j, c in enumerate(configs):
                shape = [x.val(c) if isinstance(x, Sym) else x for x in dims]
                try:
                    feeds[c][vi.name] = samples.generate(m, vi, k + 1000 * j, shape=shape)
                except Exception as e:  # noqa: BLE001
                    raise EditError(f"cannot make probe inputs for {vi.name!r}: {e}") from None
        return feeds

    @staticmethod
    def _probe(a: int, axis: int, taken: set) -> int:
        cands = [3, 2, 5, 4, 6, 7] if axis == 0 else [a + 1, a - 1, a + 2, a + 3, a - 2]
        for c in cands:
            if c >= 1 and c != a and c not in taken:
                return c
        return a + 5

    def express(self, *sig):
        """(Fraction c, symbols) with size = c x prod(symbol sizes) in every configuration
        (``sig``: the sizes at A, B[, C]), smallest set of symbols first; None when there is
        no such expression."""
        sig = tuple(sig[0]) if len(sig) == 1 and isinstance(sig[0], tuple) else sig
        cfgs = self.configs[:len(sig)]
        if len(set(sig)) == 1:
            return Fraction(sig[0]), ()
        if min(sig) <= 0:
            return None
        for r in range(1, len(self.syms) + 1):
            for combo in itertools.combinations(self.syms, r):
                prods = [math.prod(s.val(c) for s in combo) for c in cfgs]
                coef = Fraction(sig[0], prods[0])
                if all(coef * p == v for p, v in zip(prods, sig)):
                    return coef, combo
        return None

    # ------------------------------------------------------------------ building subgraphs
    def _name(self, base: str) -> str:
        return self.d.fresh(base)

    def _node(self, op, ins, base, **attrs) -> str:
        out = self._name(f"{base}_output")
        self.d.g.node.append(helper.make_node(op, ins, [out], name=self._name(base), **attrs))
        return out

    def const(self, values, dtype=np.int64, base="reshape/const") -> str:
        return self.d.add_initializer(base, np.asarray(values, dtype=dtype))

    def shape(self, value: str) -> str:
        if value not in self.shape_cache:
            self.shape_cache[value] = self._node("Shape", [value], f"{value}/Shape")
        return self.shape_cache[value]

    def gather(self, value: str, axes) -> str:
        key = (value, tuple(axes))
        if key not in self.gather_cache:
            idx = self.const(list(axes), base=f"{value}/dims")
            self.gather_cache[key] = self._node("Gather", [self.shape(value), idx],
                                                f"{value}/Shape/Gather", axis=0)
        return self.gather_cache[key]

    def product(self, value: str, axes) -> str:
        out = None
        for ax in axes:
            g = self.gather(value, [ax])
            out = g if out is None else self._node("Mul", [out, g], f"{value}/dims/Mul")
        return out

    def scaled(self, x: str, num: int, den: int, base: str) -> str:
        if num != 1:
            x = self._node("Mul", [x, self.const([num], base=f"{base}/factor")], f"{base}/Mul")
        if den != 1:
            x = self._node("Div", [x, self.const([den], base=f"{base}/divisor")], f"{base}/Div")
        return x

    def sym_source(self, c: Fraction, syms, base: str) -> str:
        """A 1-element int64 tensor equal to c x prod(syms) at run time."""
        out = None
        for s in syms:
            g = self.gather(s.source[0], [s.source[1]])
            out = g if out is None else self._node("Mul", [out, g], f"{base}/Mul")
        return self.scaled(out, c.numerator, c.denominator, base)

    def dim_source(self, sig, base: str, sibling=None) -> str:
        """A 1-element int64 tensor with the runtime size whose (A, B) sizes are ``sig``."""
        e = self.express(*sig)
        if e is not None and e[1]:
            return self.sym_source(e[0], e[1], base)
        if sibling is not None:
            return self.gather(sibling[0], [sibling[1]])
        raise _Stuck(f"a size that was {sig[0]} at the old shape and {sig[1]} at the new one "
                     f"is not a multiple of the input dims")

    def concat(self, pieces: list, base: str) -> str:
        parts, run = [], []
        for p in pieces:
            if isinstance(p, int):
                run.append(p)
                continue
            if run:
                parts.append(self.const(run, base=f"{base}/dims"))
                run = []
            parts.append(p)
        if run:
            parts.append(self.const(run, base=f"{base}/dims"))
        if len(parts) == 1:
            return parts[0]
        return self._node("Concat", parts, f"{base}/Concat", axis=0)

    def scalar(self, vec1: str, base: str) -> str:
        return self._node("Reshape", [vec1, self.const([], base=f"{base}/scalar_shape")],
                          f"{base}/to_scalar")

    # ------------------------------------------------------------------ evaluation loop
    def run(self) -> None:
        feeds = self.plan_symbols()
        self.ev = Evaluator(self.d, feeds)
        count = 0
        while True:
            order = list(self.d.g.node)
            changed = False
            for node in order:
                outs = [o for o in node.output if o]
                if all(self.ev.has(c, o) for c in self.configs for o in outs):
                    continue
                if not all(self.ev.has("A", i) for i in node.input if i):
                    continue   # an input was forgotten after a rewrite: a later pass
                if self.apply_rules(node):
                    count += 1
                    if count > MAX_REWRITES:
                        raise EditError("re-shape made too many rewrites; giving up")
                    order_fix(self.d)
                    changed = True
                    break
                self.compute(node)
            if not changed:
                break

    def compute(self, node) -> None:
        if not all(self.ev.has("A", o) for o in node.output if o):
            try:
                outs = self.ev.compute(node, "A")
            except NodeFailed as e:
                raise EditError(f"re-shape: node {node_label(node, 0)!r} ({node.op_type}) "
                                f"fails at the old shape after a rewrite: "
                                f"{error_text(e.error)}") from None
            for name, v in zip(node.output, outs):
                if not name:
                    continue
                if name in self.orig_a:
                    if not _same(self.orig_a[name], v):
                        raise EditError(
                            f"re-shape: a rewrite changed {name!r} at the old shape "
                            f"(node {node_label(node, 0)!r}, {node.op_type}); this model "
                            f"cannot be re-shaped safely here")
                else:
                    self.orig_a[name] = v
        for c in self.configs[1:]:
            try:
                self.ev.compute(node, c)
            except NodeFailed as e:
                raise EditError(self._stuck_message(node, e.error, c)) from None

    def _stuck_message(self, node, err, config="B") -> str:
        parts = []
        for i in node.input:
            if not i:
                continue
            try:
                vb = self.ev.get(config, i)
            except KeyError:
                continue
            vb = np.asarray(vb)
            desc = f"{vb.dtype}{list(vb.shape)}"
            if vb.dtype.kind in "iu" and vb.size <= 8:
                desc += f" = {vb.tolist()}" + (" (a constant)" if self.d.is_constant(i) else "")
            parts.append(f"{i!r}: {desc}")
        syms = ", ".join(f"{s.label}: {s.a} -> {s.val(config)}" for s in self.syms)
        return (f"the model cannot be re-shaped: node {node_label(node, 0)!r} ({node.op_type}) "
                f"fails at the new shape ({syms}): {error_text(err)}. Its inputs there: "
                + "; ".join(parts))

    def sig(self, name: str, axis: int) -> tuple:
        """The sizes of dim ``axis`` of ``name`` in each configuration."""
        return tuple(np.shape(self.ev.get(c, name))[axis] for c in self.configs)

    def shapes(self, name: str) -> dict:
        return {c: list(np.shape(self.ev.get(c, name))) for c in self.configs}

    def forget_from(self, nodes) -> None:
        """Forget the values of ``nodes`` and of everything downstream of them."""
        cons = self.d.consumers()
        todo = [o for n in nodes for o in n.output if o]
        seen = set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            for c in cons.get(v, []):
                todo.extend(o for o in c.output if o)
        self.ev.forget(seen)

    def note(self, node, what: str) -> None:
        self.rewrites.append(Rewrite(node_label(node, 0), node.op_type, what))

    # ------------------------------------------------------------------ rules
    def apply_rules(self, node) -> bool:
        if node.domain not in ("", "ai.onnx"):
            return False
        if not all(self.ev.has(c, i) for c in self.configs for i in node.input if i):
            return False
        op = node.op_type
        try:
            if op == "Reshape" and len(node.input) > 1:
                return self.rule_reshape(node)
            if op == "Expand":
                if self.rule_expand(node):
                    return True
            if op == "Slice":
                if self.rule_slice(node):
                    return True
            if op == "Resize" and len(node.input) > 3 and node.input[3]:
                if self.rule_resize(node):
                    return True
            if op in BROADCASTING or op in ("Concat", "MatMul"):
                return self.rule_unify(node)
        except _Stuck as e:
            raise EditError(f"the model cannot be re-shaped at node {node_label(node, 0)!r} "
                            f"({op}): {e}") from None
        return False

    def _ints(self, config, name):
        v = np.asarray(self.ev.get(config, name))
        return [int(x) for x in v.reshape(-1)]

    # -- Reshape
    def rule_reshape(self, node) -> bool:
        data, shp = node.input[0], node.input[1]
        sa, sb = list(np.shape(self.ev.get("A", data))), list(np.shape(self.ev.get("B", data)))
        if sa == sb:
            return False
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        ta, tb = self._ints("A", shp), self._ints("B", shp)
        oa = _resolve(sa, ta, allowzero)
        if oa is None:
            return False
        try:
            groups = _align(sa, oa)
        except _NoAlign:
            raise _Stuck(f"its old input shape {sa} and output shape {oa} do not line up "
                         f"axis by axis") from None
        shp = self.shapes(data)
        groups = self._merge_groups(groups, sa, sb, shp)
        pieces, expected = [], []
        for I, J in groups:
            if not J:
                continue
            if all(sa[i] == sb[i] for i in I):
                for j in J:
                    pieces.append(_Piece("const", oa[j]))
                    expected.append(oa[j])
                continue
            prods = tuple(math.prod(shp[c][i] for i in I) for c in self.configs)
            new = self._distribute(I, J, oa, prods)
            for j, p in zip(J, new):
                pieces.append(p)
                expected.append(_piece_value(p, sb, oa[j]))
        cur = _resolve(sb, tb, allowzero)
        if cur == expected:
            return False
        if math.prod(expected) != math.prod(sb):
            raise _Stuck(f"cannot find a new shape for {sb} matching its old target {oa}")
        base = node_label(node, 0)
        parts = [self._piece_tensor(p, data, base) for p in pieces]
        new_shape = self.concat(parts, f"{base}/shape")
        node.input[1] = new_shape
        shown = ", ".join(_piece_text(p, data) for p in pieces)
        self.note(node, f"target {ta} -> [{shown}]")
        self.forget_from([node])
        return True

    def _merge_groups(self, groups, sa, sb, shp):
        groups = [(list(i), list(j)) for i, j in groups]
        # input axes that vanish in the output but changed join the next (or previous) group
        k = 0
        while k < len(groups):
            I, J = groups[k]
            if I and not J and any(sa[i] != sb[i] for i in I):
                if len(groups) == 1:
                    raise _Stuck(f"the changed input axes {I} vanish in the output")
                if k + 1 < len(groups):
                    groups[k + 1][0][:0] = I       # prepend: the axes keep their order
                else:
                    groups[k - 1][0].extend(I)
                del groups[k]
                continue
            k += 1
        # a changed group that carries a symbol of old size 1 (a batch of 1) takes an
        # adjacent lone output axis of size 1 (where that batch went)
        for k, (I, J) in enumerate(groups):
            if not I or all(sa[i] == sb[i] for i in I):
                continue
            e = self.express(tuple(math.prod(shp[c][i] for i in I) for c in self.configs))
            if e is None or not any(s.a == 1 for s in e[1]):
                continue
            if len(e[1]) < 2 and len(J) > 1:
                continue   # a single symbol already has output axes to go to
            for nb in (k - 1, k + 1):
                if 0 <= nb < len(groups) and not groups[nb][0] and groups[nb][1]:
                    ones = groups[nb][1]
                    groups[k] = (I, sorted(ones + J))
                    groups[nb] = ([], [])
                    break
        return [(I, J) for I, J in groups if I or J]

    def _distribute(self, I, J, oa, prods) -> list:
        if len(J) == 1:
            return [_Piece("data", axes=tuple(I))]
        pb = prods[1]
        e = self.express(prods)
        if e is not None and e[1]:
            newvals = {j: oa[j] for j in J}
            assigned = {}
            ok = True
            for s in e[1]:
                cands = [j for j in J if j not in assigned and oa[j] % s.a == 0]
                best = [j for j in cands if oa[j] == s.a] or cands
                if not best:
                    ok = False
                    break
                j = best[0]
                assigned[j] = s
                newvals[j] = oa[j] // s.a * s.b
            if ok and math.prod(newvals.values()) == pb:
                if len(assigned) == 1:
                    (j, _), = assigned.items()
                    rest = math.prod(oa[x] for x in J if x != j)
                    return [_Piece("data", axes=tuple(I), div=rest) if x == j
                            else _Piece("const", oa[x]) for x in J]
                return [_Piece("sym", sym=assigned[j], mul=oa[j] // assigned[j].a)
                        if j in assigned else _Piece("const", oa[j]) for j in J]
        # one output axis takes the whole change
        total = math.prod(oa[j] for j in J)
        for j in J:
            rest = total // oa[j]
            if pb % rest == 0:
                return [_Piece("data", axes=tuple(I), div=rest) if x == j
                        else _Piece("const", oa[x]) for x in J]
        raise _Stuck(f"cannot split the changed axes {I} over the output axes {J}")

    def _piece_tensor(self, p: _Piece, data: str, base: str):
        if p.kind == "const":
            return int(p.value)
        if p.kind == "data":
            x = self.gather(data, list(p.axes)) if len(p.axes) == 1 else \
                self.product(data, p.axes)
            return self.scaled(x, 1, p.div, f"{base}/dim")
        g = self.gather(p.sym.source[0], [p.sym.source[1]])
        return self.scaled(g, p.mul, 1, f"{base}/dim")

    # -- Expand
    def rule_expand(self, node) -> bool:
        x, shp = node.input[0], node.input[1]
        ta, tb = self._ints("A", shp), self._ints("B", shp)
        if ta != tb:
            return False
        sa, sb = list(np.shape(self.ev.get("A", x))), list(np.shape(self.ev.get("B", x)))
        off = len(ta) - len(sb)
        new = list(tb)
        for k in range(len(ta)):
            xk = k - off
            if xk < 0:
                continue
            if sa[xk] != sb[xk] and ta[k] == sa[xk] and ta[k] != 1 and sb[xk] != ta[k]:
                new[k] = 1
        if new == tb:
            return False
        node.input[1] = self.const(new, base=f"{node_label(node, 0)}/shape")
        self.note(node, f"target {ta} -> {new} (1 lets the input's own size through)")
        self.forget_from([node])
        return True

    # -- Slice
    def _slice_args(self, node, config):
        opset = self.d.opset("") or 0
        if opset < 10:
            attrs = {a.name: list(a.ints) for a in node.attribute}
            return attrs.get("starts"), attrs.get("ends"), attrs.get("axes"), None
        def get(k):
            return self._ints(config, node.input[k]) \
                if len(node.input) > k and node.input[k] else None
        return get(1), get(2), get(3), get(4)

    def rule_slice(self, node) -> bool:
        x = node.input[0]
        sa, sb = list(np.shape(self.ev.get("A", x))), list(np.shape(self.ev.get("B", x)))
        if sa == sb:
            return False
        starts, ends_a, axes, steps = self._slice_args(node, "A")
        _, ends_b, _, _ = self._slice_args(node, "B")
        if ends_a is None or ends_a != ends_b:
            return False
        axes = axes if axes is not None else list(range(len(ends_a)))
        steps = steps if steps is not None else [1] * len(ends_a)
        new = list(ends_a)
        for k, ax in enumerate(axes):
            ax = ax % len(sa)
            if sa[ax] != sb[ax] and steps[k] > 0 and ends_a[k] == sa[ax] and sb[ax] > sa[ax]:
                new[k] = INT64_MAX
        if new == ends_a:
            return False
        label = node_label(node, 0)
        if (self.d.opset("") or 0) < 10:
            for a in node.attribute:
                if a.name == "ends":
                    del a.ints[:]
                    a.ints.extend(new)
        else:
            node.input[2] = self.const(new, base=f"{label}/ends")
        self.note(node, f"ends {ends_a} -> {['end' if v == INT64_MAX else v for v in new]} "
                        f"(it reached the end of the axis at the old shape)")
        self.forget_from([node])
        return True

    # -- Resize
    def rule_resize(self, node) -> bool:
        x, sizes = node.input[0], node.input[3]
        sa, sb = list(np.shape(self.ev.get("A", x))), list(np.shape(self.ev.get("B", x)))
        za, zb = self._ints("A", sizes), self._ints("B", sizes)
        if sa == sb or za != zb:
            return False
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
        axes = [a % len(sa) for a in axes] if axes else list(range(len(sa)))
        pieces, changed = [], False
        label = node_label(node, 0)
        for k, ax in enumerate(axes):
            if sa[ax] == sb[ax]:
                pieces.append(za[k])
                continue
            r = Fraction(za[k], sa[ax])
            pieces.append(self.scaled(self.gather(x, [ax]), r.numerator, r.denominator,
                                      f"{label}/size"))
            changed = True
        if not changed:
            return False
        node.input[3] = self.concat(pieces, f"{label}/sizes")
        self.note(node, f"sizes {za} -> the input's size times the old ratio")
        self.forget_from([node])
        return True

    # -- dims that must agree
    def rule_unify(self, node) -> bool:
        op = node.op_type
        ins = [i for i in node.input if i]
        shapes_a = [list(np.shape(self.ev.get("A", i))) for i in ins]
        shapes_b = [list(np.shape(self.ev.get("B", i))) for i in ins]
        every = [self.shapes(i) for i in ins]
        groups = []   # each: list of (input index, axis)
        if op == "Concat":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            r = len(shapes_b[0])
            if any(len(s) != r for s in shapes_b):
                return False
            axis %= r
            groups = [[(k, ax) for k in range(len(ins))] for ax in range(r) if ax != axis]
            exact = True
        elif op == "MatMul":
            ra, rb = len(shapes_b[0]), len(shapes_b[1])
            if ra < 2 or rb < 2:
                return False
            nb = max(ra, rb) - 2
            for p in range(nb):
                g = []
                for k, rk in ((0, ra), (1, rb)):
                    ax = rk - 2 - nb + p
                    if ax >= 0:
                        g.append((k, ax))
                groups.append(g)
            groups.append([(0, ra - 1), (1, rb - 2)])
            exact = False
        else:
            r = max(len(s) for s in shapes_b)
            for p in range(r):
                g = []
                for k, s in enumerate(shapes_b):
                    ax = len(s) - r + p
                    if ax >= 0:
                        g.append((k, ax))
                groups.append(g)
            exact = False
        for g in groups:
            dims_b = [shapes_b[k][ax] for k, ax in g]
            live = {v for v in dims_b if exact or v != 1}
            if len(live) <= 1:
                continue
            moved = [(k, ax) for k, ax in g if shapes_a[k][ax] != shapes_b[k][ax]]
            targets = {tuple(every[k][c][ax] for c in self.configs) for k, ax in moved}
            if len(targets) != 1:
                continue
            tsig = targets.pop()
            stale = [(k, ax) for k, ax in g if shapes_a[k][ax] == shapes_b[k][ax]
                     and shapes_b[k][ax] != tsig[1] and (exact or shapes_b[k][ax] != 1)]
            if not stale:
                continue
            key = (tuple(node.output), tuple(g), tsig)
            if key in self._conflicts:
                raise _Stuck(f"a rewrite did not make its inputs' dims agree ({dims_b} at the "
                             f"new shape)")
            self._conflicts.add(key)
            sib = moved[0]
            for k, ax in stale:
                self.trace(ins[k], ax, tsig, (ins[sib[0]], sib[1]), node, depth=0)
            return True
        return False

    # ------------------------------------------------------------------ tracing a fixed dim back
    def trace(self, value: str, axis: int, tsig, sibling, reader, depth: int) -> None:
        """Make dim ``axis`` of ``value`` (fixed at its old size) follow ``tsig``, by
        rewriting the constant it came from."""
        if depth > 64:
            raise _Stuck(f"could not find where dim {axis} of {value!r} is fixed")
        d = self.d
        if value in d.input_names():
            raise _Stuck(f"graph input {value!r} keeps its size on axis {axis}; give it a new "
                         f"shape too (reshape_inputs)")
        prod = d.producers()
        node = prod.get(value)
        if node is None or (node.op_type == "Constant" and node.domain in ("", "ai.onnx")):
            self.rewrite_constant(value, axis, tsig, sibling, reader)
            return
        op = node.op_type
        ra = list(np.shape(self.ev.get("A", value)))
        old = ra[axis]
        label = node_label(node, 0)
        sib = self._safe_sibling(sibling, node)
        if op == "Expand":
            x = node.input[0]
            xs = list(np.shape(self.ev.get("A", x)))
            off = len(ra) - len(xs)
            if axis - off < 0 or xs[axis - off] == 1:
                self.set_entry(node, 1, axis, tsig, sib, f"{label}/shape")
                return
            return self.trace(x, axis - off, tsig, sibling, reader, depth + 1)
        if op == "Tile":
            x = node.input[0]
            xs = list(np.shape(self.ev.get("A", x)))
            if xs[axis] == 1:
                self.set_entry(node, 1, axis, tsig, sib, f"{label}/repeats")
                return
            return self.trace(x, axis, tsig, sibling, reader, depth + 1)
        if op == "ConstantOfShape":
            self.set_entry(node, 0, axis, tsig, sib, f"{label}/shape")
            return
        if op == "Range":
            self.rewrite_range(node, tsig, sib)
            return
        if op == "Reshape":
            tv = self._ints("A", node.input[1])
            if len(tv) == len(ra) and tv[axis] == old:
                self.set_entry(node, 1, axis, tsig, sib, f"{label}/shape")
                return
            raise _Stuck(f"dim {axis} of {value!r} comes from Reshape {label!r} and cannot "
                         f"be changed alone")
        if op == "Slice" and (self.d.opset("") or 0) >= 10:
            x = node.input[0]
            xs = list(np.shape(self.ev.get("A", x)))
            starts, ends, axes, steps = self._slice_args(node, "A")
            axes = [a % len(xs) for a in (axes if axes is not None else range(len(ends)))]
            if axis in axes and xs[axis] != old:
                k = axes.index(axis)
                if (steps or [1] * len(axes))[k] == 1 and starts[k] >= 0:
                    src = self.dim_source(tsig, f"{label}/end", sib)
                    if starts[k]:
                        src = self._node("Add", [src, self.const([starts[k]])], f"{label}/end")
                    new = [self.const([e]) if j != k else src for j, e in enumerate(ends)]
                    node.input[2] = self.concat(new, f"{label}/ends") if len(new) > 1 else src
                    self.note(node, f"end on axis {axis}: {ends[k]} -> the new size")
                    self.forget_from([node])
                    return
            return self.trace(x, axis, tsig, sibling, reader, depth + 1)
        if op == "Gather":
            g_axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            data, idx = node.input[0], node.input[1]
            ds = list(np.shape(self.ev.get("A", data)))
            g_axis %= len(ds)
            ir = np.ndim(self.ev.get("A", idx))
            if g_axis <= axis < g_axis + ir:
                return self.trace(idx, axis - g_axis, tsig, sibling, reader, depth + 1)
            src_axis = axis if axis < g_axis else axis - ir + 1
            return self.trace(data, src_axis, tsig, sibling, reader, depth + 1)
        if op == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            perm = perm if perm is not None else list(reversed(range(len(ra))))
            return self.trace(node.input[0], perm[axis], tsig, sibling, reader, depth + 1)
        if op in ("Unsqueeze", "Squeeze"):
            x = node.input[0]
            xs = list(np.shape(self.ev.get("A", x)))
            kept = _kept_axes(xs, ra, op)
            if kept is None or axis not in kept:
                raise _Stuck(f"dim {axis} of {value!r} is made by {op} {label!r}")
            return self.trace(x, kept[axis], tsig, sibling, reader, depth + 1)
        if op == "Concat":
            c_axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(ra)
            if c_axis == axis:
                raise _Stuck(f"dim {axis} of {value!r} is a sum of Concat {label!r} inputs")
            for i in node.input:
                if i:
                    self.trace(i, axis, tsig, sibling, reader, depth + 1)
            return
        # elementwise / broadcasting / shape-preserving ops: the inputs that carry the dim
        carriers = []
        for i in node.input:
            if not i or not self.ev.has("A", i):
                continue
            s = list(np.shape(self.ev.get("A", i)))
            ax = len(s) - len(ra) + axis
            if ax >= 0 and s[ax] == old and old != 1:
                carriers.append((i, ax))
            elif ax >= 0 and old == 1 and s[ax] == 1 and len(s) == len(ra):
                carriers.append((i, ax))
        if not carriers or (op not in BROADCASTING and not self._shape_preserving(node)):
            raise _Stuck(f"dim {axis} of {value!r} comes from {op} node {label!r}, which "
                         f"re-shape cannot follow")
        for i, ax in carriers:
            self.trace(i, ax, tsig, sibling, reader, depth + 1)

    def _shape_preserving(self, node) -> bool:
        if not node.input or not node.input[0] or not node.output:
            return False
        try:
            return all(np.shape(self.ev.get(c, node.input[0])) ==
                       np.shape(self.ev.get(c, node.output[0])) for c in ("A",))
        except KeyError:
            return False

    def _safe_sibling(self, sibling, node):
        """``sibling`` (value, axis) when reading it at ``node`` makes no cycle, else None."""
        if sibling is None:
            return None
        prod = self.d.producers()
        todo, seen = [sibling[0]], set()
        outs = set(node.output)
        while todo:
            v = todo.pop()
            if v in outs:
                return None
            if v in seen:
                continue
            seen.add(v)
            p = prod.get(v)
            if p is not None:
                todo.extend(i for i in p.input if i)
        return sibling

    def set_entry(self, node, k: int, axis: int, tsig, sib, base: str) -> None:
        """Entry ``axis`` of the 1-D shape-like input ``k`` of ``node`` := the size ``tsig``
        (the other entries keep their current values)."""
        cur = self._ints("A", node.input[k])
        if axis >= len(cur):
            raise _Stuck(f"input {k} of {node.op_type} has no entry {axis}")
        src = self.dim_source(tsig, base, sib)
        pieces = [src if j == axis else v for j, v in enumerate(cur)]
        node.input[k] = self.concat(pieces, base)
        self.note(node, f"entry {axis} of {cur}: {cur[axis]} -> the new size "
                        f"({self._sig_text(tsig)})")
        self.forget_from([node])

    def _sig_text(self, tsig) -> str:
        e = self.express(*tsig)
        if e is None or not e[1]:
            return f"{tsig[0]} at the old shape"
        c, syms = e
        txt = " * ".join(s.label for s in syms)
        if c != 1:
            txt = f"{c} * {txt}"
        return txt

    def rewrite_range(self, node, tsig, sib) -> None:
        start, limit, delta = node.input[0], node.input[1], node.input[2]
        s, dlt = np.asarray(self.ev.get("A", start)), np.asarray(self.ev.get("A", delta))
        if self.ev.get("A", start) is None or s.dtype.kind not in "iu":
            raise _Stuck("a Range over non-integers")
        label = node_label(node, 0)
        n = self.dim_source(tsig, f"{label}/length", sib)
        steps = self.scaled(n, int(dlt), 1, f"{label}/limit")
        lim = self._node("Add", [steps, self.const([int(s)])], f"{label}/limit")
        lim = self.scalar(lim, f"{label}/limit")
        if np.asarray(self.ev.get("A", limit)).dtype != np.int64:
            lim = self._node("Cast", [lim], f"{label}/limit",
                             to=int(_onnx_int(np.asarray(self.ev.get("A", limit)).dtype)))
        node.input[1] = lim
        self.note(node, f"limit -> start + ({self._sig_text(tsig)}) x delta")
        self.forget_from([node])

    def rewrite_constant(self, value: str, axis: int, tsig, sibling, reader) -> None:
        """A constant fixed at the old size on ``axis``: an arithmetic progression along that
        axis (an exported arange) becomes a Range; any other data cannot follow."""
        arr = np.asarray(self.ev.get("A", value))
        if arr.ndim and arr.shape[axis] > 1 and \
                bool(np.all(arr == np.take(arr, [0], axis=axis))):
            self.rewrite_uniform(value, arr, axis, tsig, sibling)
            return
        prog = _progression(arr, axis)
        if prog is None or arr.dtype.kind not in "iuf":
            raise _Stuck(
                f"{'initializer' if value in self.d.inits else 'constant'} {value!r} "
                f"({arr.dtype}{list(arr.shape)}) holds data computed for the old size "
                f"{arr.shape[axis]} on axis {axis} (read by "
                f"{node_label(reader, 0)!r}); it cannot be regenerated for another size. "
                f"Re-export the model with that axis dynamic")
        start, step = prog
        if (self.d.opset("") or 0) < 11:
            raise _Stuck(f"constant {value!r} is a range; rewriting it needs Range (opset 11)")
        readers = [n for n in self.d.g.node if value in n.input]
        base = f"{value}/range"
        n = self.dim_source(tsig, f"{base}/length", sibling)
        dt = np.dtype(np.int64) if arr.dtype.kind in "iu" else (
            arr.dtype if arr.dtype in (np.float32, np.float64) else np.dtype(np.float32))
        if dt.kind in "iu":
            lim = self.scaled(n, int(step), 1, f"{base}/limit")
        else:
            nf = self._node("Cast", [n], f"{base}/length_float", to=int(_onnx_int(dt)))
            lim = self._node("Mul", [nf, self.const([step], dt, base=f"{base}/step")],
                             f"{base}/limit")
        lim = self._node("Add", [lim, self.const([start], dt, base=f"{base}/start")],
                         f"{base}/limit")
        r = self._node("Range", [self.const(start, dt, base=f"{base}/start"),
                                 self.scalar(lim, base),
                                 self.const(step, dt, base=f"{base}/delta")], f"{base}/Range")
        shape = [-1 if k == axis else 1 for k in range(arr.ndim)]
        out = self._node("Reshape", [r, self.const(shape, base=f"{base}/shape")],
                         f"{base}/Reshape")
        if dt != arr.dtype:
            out = self._node("Cast", [out], f"{base}/Cast", to=int(_onnx_int(arr.dtype)))
        for reader_node in readers:
            for k, i in enumerate(reader_node.input):
                if i == value:
                    reader_node.input[k] = out
        last = start + step * (arr.shape[axis] - 1)
        self.rewrites.append(Rewrite(value, "constant",
                                     f"{list(arr.shape)} range {start}..{last} -> Range over "
                                     f"the new size ({self._sig_text(tsig)})"))
        self.forget_from(readers)

    def rewrite_uniform(self, value: str, arr, axis: int, tsig, sibling) -> None:
        """A constant whose slices along ``axis`` are all equal (zeros for a batch, a mask
        repeated per sample): one slice, broadcast (or expanded) to the new size."""
        readers = [n for n in self.d.g.node if value in n.input]
        one = self.d.add_initializer(f"{value}/one", np.take(arr, [0], axis=axis))
        out = one
        how = "one slice, broadcast"
        if not all(n.op_type in BROADCASTING and n.domain in ("", "ai.onnx") for n in readers):
            base = f"{value}/expand"
            src = self.dim_source(tsig, f"{base}/size", sibling)
            shape = self.concat([src if k == axis else int(d) for k, d in enumerate(arr.shape)],
                                f"{base}/shape")
            out = self._node("Expand", [one, shape], f"{base}/Expand")
            how = f"one slice expanded to the new size ({self._sig_text(tsig)})"
        for n in readers:
            for k, i in enumerate(n.input):
                if i == value:
                    n.input[k] = out
        self.rewrites.append(Rewrite(value, "constant", f"{arr.dtype}{list(arr.shape)}, the "
                                                        f"same along axis {axis} -> {how}"))
        self.forget_from(readers)


class _Stuck(Exception):
    pass


def _ambiguous(sizes) -> bool:
    """Whether two different sets of symbols (sizes per configuration each) change by the
    same ratios, so that a dim's sizes could come from either."""
    seen = set()
    n = len(sizes)
    if n > 8:
        return False
    for r in range(1, n + 1):
        for combo in itertools.combinations(range(n), r):
            key = tuple(Fraction(math.prod(sizes[i][k] for i in combo),
                                 math.prod(sizes[i][0] for i in combo))
                        for k in range(1, len(sizes[0])))
            if key in seen:
                return True
            seen.add(key)
    return False


class _NoAlign(Exception):
    pass


def _onnx_int(dt) -> int:
    from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
    return onnx_dtype_of_np(np.dtype(dt))


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    if a.dtype.kind == "O":
        return a.tolist() == b.tolist()
    return bool(np.array_equal(a, b))


def _resolve(s, t, allowzero=0):
    """The output shape of Reshape(input of shape ``s``, target ``t``), None if invalid."""
    out, neg = [], None
    for k, v in enumerate(t):
        if v == 0 and not allowzero:
            if k >= len(s):
                return None
            out.append(s[k])
        elif v == -1:
            if neg is not None:
                return None
            neg = k
            out.append(1)
        elif v < 0:
            return None
        else:
            out.append(v)
    total = math.prod(s)
    if neg is not None:
        rest = math.prod(out)
        if rest == 0 or total % rest:
            return None
        out[neg] = total // rest
    return out if math.prod(out) == total else None


def _align(s, o):
    """Groups (input axes, output axes) of a reshape from ``s`` to ``o`` with equal products;
    size-1 axes stand alone where they can."""
    if 0 in s or 0 in o:
        raise _NoAlign
    i = j = 0
    groups = []
    while i < len(s) and j < len(o):
        if s[i] == o[j]:
            groups.append(([i], [j]))
            i += 1
            j += 1
            continue
        if s[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if o[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        I, J, pi, po = [i], [j], s[i], o[j]
        i += 1
        j += 1
        while pi != po:
            if pi < po:
                if i >= len(s):
                    raise _NoAlign
                pi *= s[i]
                I.append(i)
                i += 1
            else:
                if j >= len(o):
                    raise _NoAlign
                po *= o[j]
                J.append(j)
                j += 1
        groups.append((I, J))
    while i < len(s):
        if s[i] != 1:
            raise _NoAlign
        groups.append(([i], []))
        i += 1
    while j < len(o):
        if o[j] != 1:
            raise _NoAlign
        groups.append(([], [j]))
        j += 1
    return groups


def _piece_value(p: _Piece, sb, old) -> int:
    if p.kind == "const":
        return p.value
    if p.kind == "data":
        return math.prod(sb[i] for i in p.axes) // p.div
    return p.sym.b * p.mul


def _piece_text(p: _Piece, data: str) -> str:
    if p.kind == "const":
        return str(p.value)
    if p.kind == "data":
        txt = " * ".join(f"shape({data})[{a}]" for a in p.axes)
        return txt + (f" / {p.div}" if p.div != 1 else "")
    return p.sym.label + (f" * {p.mul}" if p.mul != 1 else "")


def _kept_axes(xs, ys, op):
    """For (Un)Squeeze: output axis -> input axis, for the axes that pass through."""
    out, i = {}, 0
    if op == "Unsqueeze":
        for j, d in enumerate(ys):
            if i < len(xs) and xs[i] == d and (len(ys) - j) >= (len(xs) - i):
                # prefer matching while enough output axes remain
                out[j] = i
                i += 1
        return out if i == len(xs) else None
    for k, d in enumerate(xs):
        if i < len(ys) and ys[i] == d:
            out[i] = k
            i += 1
    return out if i == len(ys) else None


def _progression(arr: np.ndarray, axis: int):
    """(start, step) when ``arr`` is an arithmetic progression along ``axis`` and constant
    along the others (size 1 there), else None."""
    if arr.ndim == 0 or arr.shape[axis] < 2:
        return None
    if any(s != 1 for k, s in enumerate(arr.shape) if k != axis):
        return None
    v = arr.reshape(-1)
    step = v[1] - v[0]
    if step == 0 or not np.array_equal(v, v[0] + step * np.arange(v.size, dtype=v.dtype)):
        return None
    return v[0].item(), step.item()


# ---------------------------------------------------------------------------- the edits
def _reshape(d: Draft, ctx, targets: dict, batch_axis, batch_inputs) -> Intent:
    inputs = d.input_names()
    for name, dims in targets.items():
        if name not in inputs:
            raise EditError(f"{name!r} is not a graph input; the inputs are {inputs}")
        vi = d.value_info(name)
        old = shape_of(vi)
        if not isinstance(dims, (list, tuple)):
            raise EditError(f"the new shape of {name!r} is a list of dims")
        if old is not None and len(old) != len(dims):
            raise EditError(f"input {name!r} has rank {len(old)}; {len(dims)} dims given")
        for x in dims:
            if not (x is None or isinstance(x, str) and x.strip() or
                    isinstance(x, int) and not isinstance(x, bool) and x > 0):
                raise EditError(f"a dim is a positive int or a name, got {x!r} for {name!r}")
    before = d.snapshot_liveness()
    r = Reshaper(d, ctx, {k: list(v) for k, v in targets.items()})
    r.run()
    for name, dims in targets.items():
        set_shape(d.value_info(name), dims)
    _declare_outputs(d, r)
    d.clear_value_info()
    pruned = d.prune(before)
    if r.rewrites:
        d.notes.append(f"{len(r.rewrites)} constant(s) baked from the old shape rewritten:")
        d.notes.extend(f"  {w}" for w in r.rewrites[:SHOWN_REWRITES])
        if len(r.rewrites) > SHOWN_REWRITES:
            d.notes.append(f"  ... and {len(r.rewrites) - SHOWN_REWRITES} more "
                           f"(step.rewrites lists them all)")
    else:
        d.notes.append("no constant was baked from the old shape")
    if pruned:
        d.notes.append(f"removed {len(pruned)} node(s) left unused")
    olds = {s.source: s for s in r.syms}
    intent = Intent(KEEPS, "a re-shape keeps the function")
    intent.custom = _make_check(r, targets, batch_axis, batch_inputs, olds)
    intent.rewrites = [str(w) for w in r.rewrites]
    return intent


def _declare_outputs(d: Draft, r: Reshaper) -> None:
    for o in d.g.output:
        if not o.type.HasField("tensor_type"):
            continue
        try:
            per = [np.shape(r.ev.get(c, o.name)) for c in r.configs]
        except KeyError:
            continue
        old = shape_of(o)
        dims = []
        for k, sig in enumerate(zip(*per)):
            x, y = sig[0], sig[1]
            if len(set(sig)) == 1:
                dims.append(old[k] if old is not None and k < len(old) and
                            not isinstance(old[k], int) else x)
                continue
            e = r.express(sig)
            if e is not None and len(e[1]) == 1 and e[0] == 1:
                dims.append(e[1][0].target)
            elif all(isinstance(s.target, int) for s in r.syms):
                dims.append(y)
            else:
                dims.append(None)
        set_shape(o, dims)


def _make_check(r: Reshaper, targets, batch_axis, batch_inputs, olds):
    """The check of a re-shape: same outputs at the old shape; for a batch change, the same
    outputs sample by sample at the new batch size (and a second one when symbolic)."""
    syms = r.syms
    batch_syms = [s for s in syms if batch_axis is not None and s.source[1] == batch_axis
                  and (batch_inputs is None or s.source[0] in batch_inputs)]

    def check(checker, m_before, m_after):
        from workbench.edit import verify  # noqa: PLC0415
        errors, notes = {}, []
        relaxed = _relaxed(m_after)
        run_before, run_after = verify.runner(m_before), verify.runner(relaxed)
        feeds = r.ev.vals["A"]
        ins = {v.name for v in m_before.graph.input}
        fa = {k: v for k, v in feeds.items() if k in ins}
        out_b = run_before(fa)
        out_a = run_after(fa)
        for k in out_b:
            if k in out_a:
                errors[f"{k} @ old shape"] = verify.compare(out_a[k], out_b[k])
        notes.append("at the old shape: the same outputs as before" if all(
            e <= verify.SAME_TOL for e in errors.values()) else "at the old shape: DIFFERENT")
        if batch_syms:
            s = batch_syms[0]
            sizes = [s.b] if isinstance(s.target, int) else [s.b, s.b + 2]
            for n in sizes:
                errs = _per_sample(run_before, run_after, fa, s, n, batch_axis)
                for k, e in errs.items():
                    errors[f"{k} @ batch {n}, per sample"] = e
                notes.append(f"batch {n}: each sample's outputs equal the model before run "
                             f"on that sample alone")
        else:
            feeds_b = {k: v for k, v in r.ev.vals["B"].items() if k in ins}
            got = run_after(feeds_b)
            shapes = ", ".join(f"{k}: {list(np.shape(v))}" for k, v in got.items())
            notes.append(f"runs at the new shape ({shapes}); the model before cannot run "
                         f"there, so only the old shape is compared")
        return errors, notes

    return check


def _relaxed(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` with every input dim symbolic (to run it at any size for the checks)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    inits = {t.name for t in out.graph.initializer}
    for k, vi in enumerate(v for v in out.graph.input if v.name not in inits):
        shp = shape_of(vi)
        if shp is not None:
            set_shape(vi, [f"__dim_{k}_{j}" for j in range(len(shp))])
    for o in out.graph.output:
        shp = shape_of(o)
        if shp is not None:
            set_shape(o, [None] * len(shp))
    del out.graph.value_info[:]
    return out


def _per_sample(run_before, run_after, feeds_old: dict, sym: Sym, n: int, axis: int) -> dict:
    """Run the edited model at batch ``n`` and the model before on the same samples at its
    own batch (``sym.a``); compare row by row."""
    from workbench.edit import verify  # noqa: PLC0415
    feeds_old = {k: np.asarray(v) for k, v in feeds_old.items()}
    batched = {k for k, v in feeds_old.items() if (k, axis) in sym.uses}
    if not batched:
        return {}
    rng = np.random.default_rng(1)
    big = {}
    for k, v in feeds_old.items():
        if k in batched:
            reps = [v] * (-(-n // max(1, v.shape[axis])) + 1)
            cat = np.concatenate(reps, axis=axis)
            if v.dtype.kind == "f":
                cat = cat + rng.standard_normal(cat.shape).astype(v.dtype) * 0.5
            elif v.dtype.kind in "iu" and v.size:
                hi = int(v.max()) + 1
                cat = rng.integers(0, max(hi, 2), size=cat.shape).astype(v.dtype)
            big[k] = np.take(cat, np.arange(n), axis=axis)
        else:
            big[k] = v
    out_new = run_after(big)
    old_b = sym.a
    errors: dict = {}
    per_old: dict = {}
    for c in range(-(-n // old_b)):
        idx = np.arange(c * old_b, (c + 1) * old_b) % n
        feeds = {k: (np.take(v, idx, axis=axis) if k in batched else v) for k, v in big.items()}
        for k, v in run_before(feeds).items():
            per_old.setdefault(k, []).append((idx, v))
    for k, parts in per_old.items():
        if k not in out_new:
            continue
        new = np.asarray(out_new[k])
        ax = _batch_axis_of(np.asarray(parts[0][1]).shape, new.shape, old_b, n)
        if ax is None:
            continue
        worst = 0.0
        for idx, v in parts:
            for row, i in enumerate(idx):
                worst = max(worst, verify.compare(np.take(new, [i], axis=ax),
                                                  np.take(np.asarray(v), [row], axis=ax)))
        errors[k] = worst
    return errors


def _batch_axis_of(old_shape, new_shape, old_b, n):
    if len(old_shape) != len(new_shape):
        return None
    for ax, (x, y) in enumerate(zip(old_shape, new_shape)):
        if x == old_b and y == n:
            if all(a == b for k, (a, b) in enumerate(zip(old_shape, new_shape)) if k != ax):
                return ax
    return None


@edit("reshape_inputs")
def reshape_inputs(d: Draft, ctx, shapes: dict, batch_axis: int | None = None) -> Intent:
    """New shapes for graph inputs (``{input: [dims]}``; ints fix a dim, names make it
    symbolic), rewriting every constant baked from the old shapes (see the module docstring).
    ``batch_axis``: the axis that is the batch (its change is then checked sample by
    sample)."""
    if not isinstance(shapes, dict) or not shapes:
        raise EditError("reshape_inputs needs {input: [dims], ...}")
    return _reshape(d, ctx, shapes, batch_axis, None)


@edit("rebatch")
def rebatch(d: Draft, ctx, batch, inputs: list | None = None, axis: int = 0) -> Intent:
    """A new batch size: an int, or a name (a symbolic batch). ``inputs``: the inputs with a
    batch axis (default: every input whose dim ``axis`` has the same size or name as the
    first input's). Constants baked from the old batch are rewritten; the edited model is
    checked sample by sample against the model before."""
    if not (isinstance(batch, str) and batch.strip() or
            isinstance(batch, int) and not isinstance(batch, bool) and batch > 0):
        raise EditError(f"batch is a positive int or a name, got {batch!r}")
    names = d.input_names()
    if inputs is None:
        firsts = {}
        for n in names:
            s = shape_of(d.value_info(n))
            if s is not None and len(s) > axis:
                firsts[n] = s[axis]
        if not firsts:
            raise EditError(f"no input has an axis {axis}")
        ref = firsts[names[0]] if names[0] in firsts else next(iter(firsts.values()))
        inputs = [n for n, v in firsts.items() if v == ref]
    targets = {}
    for n in inputs:
        if n not in names:
            raise EditError(f"{n!r} is not a graph input; the inputs are {names}")
        s = shape_of(d.value_info(n))
        if s is None or len(s) <= axis:
            raise EditError(f"input {n!r} has no axis {axis}")
        new = list(s)
        new[axis] = batch
        targets[n] = new
    if all(shape_of(d.value_info(n))[axis] == batch for n in targets):
        raise EditError(f"the batch is {batch!r} already")
    return _reshape(d, ctx, targets, axis, set(targets))


__all__ = ["reshape_inputs", "rebatch", "numpy_helper"]
