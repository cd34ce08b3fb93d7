"""The activation layout of a whole network, chosen once at prepare time (an inference pass).

Depthwise and 1x1 convolutions are memory-bound; in channels-last order (NHWC) a depthwise
tap is a multiply-add over contiguous channels (vectorised), a 1x1 convolution is one plain
``(N*H*W, C) @ (C, M)`` product, and a network's elementwise ops, pools and channel concats
and splits need nothing else. Converting per layer would cost more than the kernels gain
(a round trip of MobileNetV2's activations costs about what its depthwise layers cost), so
:func:`to_channels_last` rewrites the whole region of the graph that can stay channels-last
and converts only at its borders (graph inputs and outputs, and ops without a channels-last
form). It runs for CPU plans when the network has depthwise convolutions, or group-1 KxK
convolutions and the compiled indirect-GEMM kernel for them is ready (``layout="auto"`` in
:func:`workbench.graph.passes.optimize`, see :func:`wants_channels_last`); ``"nhwc"`` forces
it on any 2-D convolution network (tests, benchmarks), ``None`` keeps the graph as it is.

What becomes channels-last (each node's inputs from outside the region get one ``Transpose``
to NHWC per value, shared; region values read from outside get one ``Transpose`` back):

- ``Conv`` / ``FusedConv`` (2-D) -> ``com.workbench::NhwcConv`` (weights "HWIO": a constant
  is transposed here, a trainable one by a ``Transpose`` node in the plan);
- pointwise ops (registered ``elementwise=True``: Relu, Clip, Add, Mul, ...) whose other
  inputs are region values, scalars or constants (re-laid-out here);
- MaxPool (one output) / AveragePool / GlobalAveragePool / GlobalMaxPool -> their ``Nhwc``
  forms; ``Concat`` and ``Split`` (axis remapped), ``Slice`` with constant axes, ``Reduce*``
  with ``keepdims`` and constant axes;
- ``Shape`` of a region value -> ``Shape`` + ``Gather`` (the logical NCHW shape, so shape
  arithmetic in the graph is unchanged);
- ShuffleNet's channel shuffle ``Reshape -> Transpose(0, 2, 1, 3, 4) -> Reshape`` ->
  ``com.workbench::NhwcChannelShuffle`` (checked at run time, see ``ops/nhwc.py``); a channel
  ``Concat`` read only by such a shuffle (and by ``Shape``) -> ``NhwcConcatShuffle``, its
  inputs written straight into their shuffled places (the shuffle then passes it on; no step
  at all when the shuffle's shapes are constants);
- the graph's own layout transposes (ConvNeXt-like blocks: ``Transpose(0, 2, 3, 1)`` before a
  LayerNorm over channels, ``Transpose(0, 3, 1, 2)`` back): the first of a region value is an
  ``Identity`` of its array, the second's input is used as the region's form of its output.

Then :func:`chain_convs` joins MobileNet's inverted residual (1x1 expand -> depthwise 3x3 ->
1x1 project, with constant weights, the middle values read by nothing else) into one
``com.workbench::NhwcConvChain`` that computes it band by band of rows (the expanded
activation stays in cache; ``ops/conv_nhwc.py``); a chain read only by ShuffleNet's
``NhwcConcatShuffle`` of two halves writes its bands straight into the shuffled output.

Every region value is renamed ``<name>__nhwc``; the original name, where it is still read
(or is a graph output), is produced by the conversion back, so every name keeps its NCHW
meaning.
"""

from __future__ import annotations

import numpy as np

from workbench.graph.ir import Graph, Node, ValueInfo
from workbench.graph.toposort import topological_order
from workbench.ops.registry import FUSED_DOMAIN, facts, has_kernel

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]
#: NCHW axis -> NHWC axis
AXIS = {0: 0, 1: 3, 2: 1, 3: 2}
SUFFIX = "__nhwc"



def _nhwc_pool(n: Node):
    """The channels-last form of a standard pooling node (``Nhwc<op>``, registered in
    ``ops/pool.py``), or None."""
    if n.domain or facts(n.op_type).category != "pooling":
        return None
    name = "Nhwc" + n.op_type
    return name if has_kernel(name, FUSED_DOMAIN) else None


def _is_reduce(n: Node) -> bool:
    return not n.domain and n.op_type.startswith("Reduce") and \
        facts(n.op_type).category == "reduction"


def _weights(g: Graph, name: str, producers=None):
    """The value info of a convolution's weights: a trainable model's inference graph
    computes them (``FoldBatchNormWeights``, which keeps the shape and type of its first
    input), where the graph may not record a shape."""
    v = g.value(name)
    if v is not None and v.shape is not None:
        return v
    p = (producers or {}).get(name)
    if p is not None and p.op_type == "FoldBatchNormWeights" and p.domain == FUSED_DOMAIN \
            and p.outputs and p.outputs[0] == name:
        return g.value(p.inputs[0])
    return v


def _conv_facts(g: Graph, n: Node, producers=None):
    """(C, M, group, kh, kw) of a 2-D float Conv/FusedConv node, or None."""
    if not ((n.op_type == "Conv" and not n.domain)
            or (n.op_type == "FusedConv" and n.domain == FUSED_DOMAIN)):
        return None
    if len(n.inputs) < 2 or len(n.outputs) != 1:
        return None
    w = _weights(g, n.inputs[1], producers)
    x = g.value(n.inputs[0])
    if w is None or w.shape is None or len(w.shape) != 4 or \
            not all(isinstance(d, int) for d in w.shape):
        return None
    if x is not None and x.shape is not None and len(x.shape) != 4:
        return None
    if w.dtype not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        return None
    if n.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "", "VALID", b"VALID"):
        return None  # SAME_* padding depends on the input size: kept simple, stays NCHW
    M, Cg, kh, kw = w.shape
    group = int(n.attrs.get("group", 1))
    return Cg * group, M, group, kh, kw


def wants_channels_last(g: Graph) -> bool:
    """The "auto" rule: the network has a depthwise convolution (group == C == M > 1), or a
    float32 group-1 KxK convolution and the compiled indirect-GEMM convolution
    (``gemm_avx2.iconv``) is ready now. Measured on ResNet-18 (224x224, one thread, CPU
    time): channels-last with that kernel is ~1.4x faster than the NCHW path, but on the
    numpy fallback ~1.25x slower, so without the kernel (not built yet: the choice is made
    at prepare and never waits for a compiler; no compiler; no AVX2/FMA; kernels off) such
    a network stays NCHW."""
    kind = _conv_kind(g)
    return kind == "depthwise" or (kind == "kxk" and _indirect_conv_ready())


def _conv_kind(g: Graph):
    """"depthwise" when the network has a depthwise convolution, else "kxk" when it has a
    float32 group-1 convolution with a kernel larger than 1x1, else None."""
    producers = {o: n for n in g.nodes for o in n.outputs if o}
    kxk = False
    for n in g.nodes:
        f = _conv_facts(g, n, producers)
        if f is not None:
            C, M, group, kh, kw = f
            if group > 1 and group == C == M and kh * kw > 1:
                return "depthwise"
            if group == 1 and kh * kw > 1 and _weights(g, n.inputs[1], producers).dtype == 1:
                kxk = True
    return "kxk" if kxk else None


def _indirect_conv_ready() -> bool:
    """Whether the compiled KxK convolution is loaded. Built already (in the kernel cache: a
    fresh process's first prepare), it is loaded now (a library load, no compiler: waited
    for at most 2 s); else asking starts its build in the background and the answer is no
    (a later prepare may find it ready)."""
    from workbench import compiled  # noqa: PLC0415
    from workbench.compiled import cache  # noqa: PLC0415

    if compiled.kernel("gemm_avx2.iconv") is not None:
        return True
    try:
        built = cache.fresh_meta("gemm_avx2", cache.cache_dir(create=False)) is not None
    except OSError:
        built = False
    return built and compiled.wait(["gemm_avx2"], timeout=2.0)


class _Rewriter:
    def __init__(self, g: Graph, variables):
        self.g = g
        self.variables = frozenset(variables)
        self.names = {v.name for v in g.inputs} | {v.name for v in g.outputs} | \
            set(g.initializers) | {o for n in g.nodes for o in n.outputs} | \
            {i for n in g.nodes for i in n.inputs}
        self.nhwc: dict = {}      # original (NCHW) name -> its channels-last value
        self.to_nhwc: dict = {}   # NCHW value -> its Transpose to NHWC (made on demand)
        self.out: list = []
        self.consts: dict = {}    # (name, tag) -> new initializer name
        self.producer = {o: n for n in g.nodes for o in n.outputs if o}
        #: region values NhwcConcatShuffle wrote shuffled -> their group count
        self.shuffled: dict = {}

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name = f"{base}_{i}"
            i += 1
        self.names.add(name)
        return name

    def const(self, name):
        if name in self.g.initializers and name not in self.variables:
            return np.asarray(self.g.initializers[name])
        return None

    def rank(self, name):
        v = self.g.value(name)
        return None if v is None or v.shape is None else len(v.shape)

    def info(self, name, new_name):
        v = self.g.value(name)
        if v is not None and v.shape is not None and len(v.shape) == 4:
            s = v.shape
            self.g.value_info[new_name] = ValueInfo(new_name, v.dtype,
                                                    (s[0], s[2], s[3], s[1]))

    def nhwc_input(self, name: str) -> str:
        """The channels-last form of value ``name`` (a Transpose made once if needed)."""
        if name in self.nhwc:
            return self.nhwc[name]
        p = self.producer.get(name)
        if p is not None and _is_transpose(p, TO_NCHW):
            # the graph's own NHWC -> NCHW transpose (ConvNeXt-like blocks): its input already
            # is the channels-last array
            return p.inputs[0]
        if name not in self.to_nhwc:
            t = self.fresh(name + SUFFIX)
            self.out.append(Node("Transpose", [name], [t], {"perm": list(TO_NHWC)},
                                 self.fresh(f"{name}/to_nhwc"), ""))
            self.info(name, t)
            self.to_nhwc[name] = t
        return self.to_nhwc[name]

    def has_nhwc(self, name: str) -> bool:
        """Whether a channels-last form of ``name`` exists without a conversion."""
        p = self.producer.get(name)
        return name in self.nhwc or (p is not None and _is_transpose(p, TO_NCHW))

    def region_output(self, name: str) -> str:
        t = self.fresh(name + SUFFIX)
        self.info(name, t)
        self.nhwc[name] = t
        return t

    def relaid_const(self, name: str):
        """A constant operand of a pointwise op in channels-last order, or None."""
        a = self.const(name)
        if a is None or a.ndim > 4:
            return None
        if a.size == 1 or a.ndim <= 1 and (a.ndim == 0 or a.shape[0] == 1):
            return name
        key = (name, "nhwc")
        if key not in self.consts:
            a4 = a.reshape((1,) * (4 - a.ndim) + a.shape)
            new = self.fresh(name + SUFFIX)
            self.g.initializers[new] = np.ascontiguousarray(a4.transpose(TO_NHWC))
            self.consts[key] = new
        return self.consts[key]

    def const_ints(self, name: str, values):
        new = self.fresh(name + SUFFIX)
        self.g.initializers[new] = np.asarray(values, dtype=np.int64)
        return new

    # -------------------------------------------------------------------------- rules
    def conv(self, n: Node) -> bool:
        if _conv_facts(self.g, n, self.producer) is None:
            return False
        ins = list(n.inputs) + [""] * (4 - len(n.inputs))
        x = self.nhwc_input(ins[0])
        w = ins[1]
        wc = self.const(w)
        if wc is not None:
            key = (w, "hwio")
            if key not in self.consts:
                new = self.fresh(w + "__hwio")
                self.g.initializers[new] = np.ascontiguousarray(wc.transpose(2, 3, 1, 0))
                self.consts[key] = new
            wn = self.consts[key]
        else:
            key = (w, "hwio")
            if key not in self.consts:
                new = self.fresh(w + "__hwio")
                self.out.append(Node("Transpose", [w], [new], {"perm": [2, 3, 1, 0]},
                                     self.fresh(f"{w}/to_hwio"), ""))
                self.consts[key] = new
            wn = self.consts[key]
        z = self.nhwc_input(ins[3]) if ins[3] else ""
        attrs = {k: v for k, v in n.attrs.items()}
        attrs.setdefault("activation", "")
        attrs.setdefault("activation_params", [])
        y = self.region_output(n.outputs[0])
        self.out.append(Node("NhwcConv", [x, wn, ins[2], z], [y], attrs, n.name, FUSED_DOMAIN,
                             n.doc_string))
        return True

    def pointwise(self, n: Node) -> bool:
        f = facts(n.op_type, n.domain)
        if not f.elementwise or len(n.outputs) != 1 or n.subgraphs:
            return False
        if not any(self.has_nhwc(i) for i in n.inputs if i):
            return False
        new_inputs = []
        for i in n.inputs:
            if not i:
                new_inputs.append(i)
            elif i in self.nhwc:
                new_inputs.append(self.nhwc[i])
            elif self.const(i) is not None:
                c = self.relaid_const(i)
                if c is None:
                    return False
                new_inputs.append(c)
            elif self.has_nhwc(i) or self.rank(i) == 4:
                new_inputs.append(self.nhwc_input(i))
            else:
                return False  # a value whose broadcast in NHWC is not known here
        y = self.region_output(n.outputs[0])
        self.out.append(Node(n.op_type, new_inputs, [y], dict(n.attrs), n.name, n.domain,
                             n.doc_string))
        return True

    def pool(self, n: Node) -> bool:
        op = _nhwc_pool(n)
        if op is None or len(n.outputs) != 1 or n.inputs[0] not in self.nhwc:
            return False
        if n.op_type in ("MaxPool", "AveragePool"):
            ks = n.attrs.get("kernel_shape")
            if ks is None or len(ks) != 2:
                return False
        attrs = {k: v for k, v in n.attrs.items() if k != "storage_order"}
        y = self.region_output(n.outputs[0])
        self.out.append(Node(op, [self.nhwc[n.inputs[0]]], [y], attrs, n.name,
                             FUSED_DOMAIN, n.doc_string))
        return True

    def concat(self, n: Node, consumers=None, outputs=()) -> bool:
        if n.op_type != "Concat" or n.domain or not any(i in self.nhwc for i in n.inputs):
            return False
        if any(self.rank(i) not in (4, None) and i not in self.nhwc for i in n.inputs):
            return False
        if any(i not in self.nhwc and self.rank(i) != 4 for i in n.inputs):
            return False
        axis = int(n.attrs.get("axis", 1))
        axis = axis + 4 if axis < 0 else axis
        if axis not in AXIS:
            return False
        ins = [self.nhwc_input(i) for i in n.inputs]
        y = self.region_output(n.outputs[0])
        g = self.shuffled_concat(n, axis, consumers, outputs)
        if g:
            self.shuffled[y] = g
            self.out.append(Node("NhwcConcatShuffle", ins, [y], {"groups": g}, n.name,
                                 FUSED_DOMAIN, n.doc_string))
            return True
        self.out.append(Node("Concat", ins, [y], {**n.attrs, "axis": AXIS[axis]}, n.name, "",
                             n.doc_string))
        return True

    def shuffled_concat(self, n: Node, axis: int, consumers, outputs) -> int:
        """The group count ``g`` when channel Concat ``n`` can be written shuffled
        (NhwcConcatShuffle): its output is read only by the first Reshape of a channel shuffle
        (see :meth:`shuffle`) and by Shape nodes, and the graph gives ``g`` (the Reshape's
        constant shape or its output's inferred shape); 0 otherwise. A wrong ``g`` costs
        speed, never the result: the shuffle checks it at run time."""
        c = n.outputs[0]
        if consumers is None or axis != 1 or c in outputs or len(n.outputs) != 1:
            return 0
        users = consumers.get(c, [])
        rs = [u for u in users if not (u.op_type == "Shape" and not u.domain)]
        if len(rs) != 1 or rs[0].inputs[0] != c or c in rs[0].inputs[1:] or \
                _shuffle_chain(rs[0], consumers, outputs, self.rank) is None:
            return 0
        r = rs[0]
        g = None
        s5 = self.const(r.inputs[1])
        if s5 is not None and s5.ndim == 1 and s5.size == 5 and int(s5[1]) > 0:
            g = int(s5[1])
        else:
            v = self.g.value(r.outputs[0])
            if v is not None and v.shape is not None and len(v.shape) == 5 and \
                    isinstance(v.shape[1], int) and v.shape[1] > 0:
                g = v.shape[1]
        return g if g is not None and g > 1 else 0

    def split(self, n: Node) -> bool:
        if n.op_type != "Split" or n.domain or n.inputs[0] not in self.nhwc:
            return False
        axis = int(n.attrs.get("axis", 0))
        axis = axis + 4 if axis < 0 else axis
        if axis not in AXIS:
            return False
        ys = [self.region_output(o) if o else "" for o in n.outputs]
        self.out.append(Node("Split", [self.nhwc[n.inputs[0]]] + list(n.inputs[1:]), ys,
                             {**n.attrs, "axis": AXIS[axis]}, n.name, "", n.doc_string))
        return True

    def slice_(self, n: Node, opset: int) -> bool:
        if n.op_type != "Slice" or n.domain or n.inputs[0] not in self.nhwc:
            return False
        if opset < 10:
            axes = n.attrs.get("axes") or list(range(len(n.attrs.get("starts", []))))
            axes = [int(a) + 4 if int(a) < 0 else int(a) for a in axes]
            if any(a not in AXIS for a in axes):
                return False
            y = self.region_output(n.outputs[0])
            self.out.append(Node("Slice", [self.nhwc[n.inputs[0]]], [y],
                                 {**n.attrs, "axes": [AXIS[a] for a in axes]}, n.name, "",
                                 n.doc_string))
            return True
        ins = list(n.inputs) + [""] * (5 - len(n.inputs))
        if ins[3]:
            a = self.const(ins[3])
            if a is None:
                return False
            axes = [int(v) for v in a.reshape(-1)]
        else:
            starts = self.g.value(ins[1])
            if starts is None or starts.shape is None or len(starts.shape) != 1 or \
                    not isinstance(starts.shape[0], int):
                return False
            axes = list(range(starts.shape[0]))
        axes = [a + 4 if a < 0 else a for a in axes]
        if any(a not in AXIS for a in axes):
            return False
        ins[3] = self.const_ints(ins[3] or n.name + "/axes", [AXIS[a] for a in axes])
        ins[0] = self.nhwc[ins[0]]
        while ins and not ins[-1]:
            ins.pop()
        y = self.region_output(n.outputs[0])
        self.out.append(Node("Slice", ins, [y], dict(n.attrs), n.name, "", n.doc_string))
        return True

    def reduce(self, n: Node, opset: int) -> bool:
        if not _is_reduce(n) or n.inputs[0] not in self.nhwc or \
                not int(n.attrs.get("keepdims", 1)):
            return False
        attrs = dict(n.attrs)
        ins = list(n.inputs)
        if "axes" in attrs:
            axes = [int(a) + 4 if int(a) < 0 else int(a) for a in attrs["axes"]]
            if any(a not in AXIS for a in axes):
                return False
            attrs["axes"] = [AXIS[a] for a in axes]
        elif len(ins) > 1 and ins[1]:
            a = self.const(ins[1])
            if a is None:
                return False
            axes = [int(v) + 4 if int(v) < 0 else int(v) for v in a.reshape(-1)]
            if any(v not in AXIS for v in axes):
                return False
            ins[1] = self.const_ints(ins[1], [AXIS[v] for v in axes])
        ins[0] = self.nhwc[ins[0]]
        y = self.region_output(n.outputs[0])
        self.out.append(Node(n.op_type, ins, [y], attrs, n.name, "", n.doc_string))
        return True

    def transpose(self, n: Node) -> bool:
        """The graph's own NCHW -> NHWC transpose of a region value is that value's array."""
        if not _is_transpose(n, TO_NHWC) or n.inputs[0] not in self.nhwc:
            return False
        self.out.append(Node("Identity", [self.nhwc[n.inputs[0]]], [n.outputs[0]], {}, n.name,
                             "", n.doc_string))
        return True

    def shape(self, n: Node) -> bool:
        if n.op_type != "Shape" or n.domain or n.inputs[0] not in self.nhwc:
            return False
        start = int(n.attrs.get("start", 0))
        end = n.attrs.get("end")
        idx = list(TO_NCHW)[slice(start, None if end is None else int(end))]
        s = self.fresh(n.outputs[0] + SUFFIX)
        self.out.append(Node("Shape", [self.nhwc[n.inputs[0]]], [s], {}, n.name, "",
                             n.doc_string))
        ind = self.fresh(n.name + "/nchw_axes")
        self.g.initializers[ind] = np.asarray(idx, dtype=np.int64)
        self.out.append(Node("Gather", [s, ind], [n.outputs[0]], {"axis": 0},
                             self.fresh(n.name + "/nchw_order"), ""))
        return True

    def shuffle(self, n: Node, consumers, outputs, pending) -> bool:
        """Reshape -> Transpose(0, 2, 1, 3, 4) -> Reshape of a region value: one
        NhwcChannelShuffle, placed where the second Reshape was (its shape input may be
        computed after the first Reshape)."""
        if n.inputs[0] not in self.nhwc:
            return False
        chain = _shuffle_chain(n, consumers, outputs, self.rank)
        if chain is None:
            return False
        t, r = chain
        allow = int(n.attrs.get("allowzero", 0)) or int(r.attrs.get("allowzero", 0))
        x = self.nhwc[n.inputs[0]]
        attrs = {"allowzero": allow}
        if x in self.shuffled:  # written shuffled by NhwcConcatShuffle
            attrs["shuffled"] = self.shuffled[x]
            if self.static_shuffle(n, r, bool(allow)) == self.shuffled[x]:
                # constant shapes (a plan for given input shapes): no step at all
                def emit():
                    self.nhwc[r.outputs[0]] = x
                pending[id(t)] = None
                pending[id(r)] = emit
                return True
        name, doc = n.name, n.doc_string

        def emit():
            y = self.region_output(r.outputs[0])
            self.out.append(Node("NhwcChannelShuffle", [x, n.inputs[1], r.inputs[1]], [y],
                                 attrs, name, FUSED_DOMAIN, doc))
        pending[id(t)] = None
        pending[id(r)] = emit
        return True


    def static_shuffle(self, n: Node, r: Node, allowzero: bool) -> int:
        """The group count of the channel shuffle ``n -> Transpose -> r`` when both shapes are
        constants and the input's shape is static (a plan for given input shapes), 0 when
        that is not known or not a channel shuffle."""
        from workbench.ops.shape import _target_shape  # noqa: PLC0415

        v = self.g.value(n.inputs[0])
        s5, s4 = self.const(n.inputs[1]), self.const(r.inputs[1])
        if v is None or v.shape is None or len(v.shape) != 4 or s5 is None or s4 is None or \
                not all(isinstance(d, int) for d in v.shape):
            return 0
        try:
            t5 = _target_shape(v.shape, [int(d) for d in s5.reshape(-1)], allowzero)
            t4 = _target_shape((t5[0], t5[2], t5[1], t5[3], t5[4]) if len(t5) == 5 else t5,
                               [int(d) for d in s4.reshape(-1)], allowzero)
        except Exception:   # noqa: BLE001 - not a valid reshape: left to the kernel's check
            return 0
        N, C, H, W = v.shape
        g = t5[1] if len(t5) == 5 else 0
        ok = g >= 1 and C % g == 0 and t5 == (N, g, C // g, H, W) and t4 == tuple(v.shape)
        return g if ok else 0


def _shuffle_chain(n: Node, consumers, outputs, rank):
    """``(Transpose, Reshape)`` when ``n`` is the first Reshape of a channel shuffle
    ``Reshape -> Transpose(0, 2, 1, 3, 4) -> Reshape`` (each read only by the next, the last
    of rank 4 or unknown); None otherwise."""
    if n.op_type != "Reshape" or n.domain or len(n.inputs) < 2:
        return None
    t = _only(consumers, outputs, n.outputs[0])
    if t is None or t.op_type != "Transpose" or t.domain or \
            [int(p) for p in t.attrs.get("perm", [])] != [0, 2, 1, 3, 4]:
        return None
    r = _only(consumers, outputs, t.outputs[0])
    if r is None or r.op_type != "Reshape" or r.domain or len(r.inputs) < 2 or \
            rank(r.outputs[0]) not in (4, None):
        return None
    return t, r


def _is_transpose(n: Node, perm) -> bool:
    return n.op_type == "Transpose" and not n.domain and len(n.inputs) == 1 and \
        [int(p) for p in n.attrs.get("perm", [])] == list(perm)


def _only(consumers, outputs, value):
    users = consumers.get(value, [])
    if len(users) != 1 or value in outputs:
        return None
    return users[0]


def to_channels_last(graph: Graph, variables=frozenset(), *, mode: str | None = "auto"):
    """Rewrite ``graph`` so that its convolutional region runs channels-last (see the module
    docstring); returns a new graph (or ``graph`` itself when nothing changes)."""
    if mode is None or mode == "nchw":
        return graph
    if mode not in ("auto", "nhwc"):
        raise ValueError(f"layout mode {mode!r}: use 'auto', 'nhwc' or None")
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    if not any(_conv_facts(graph, n, producers) is not None for n in graph.nodes):
        return graph
    if mode == "auto" and not wants_channels_last(graph):
        return graph
    if any(n.subgraphs for n in graph.nodes):
        return graph  # values read by If/Loop bodies: kept simple, the graph stays NCHW
    g = graph.copy()
    g.initializers = dict(g.initializers)
    g.value_info = dict(g.value_info)
    rw = _Rewriter(g, variables)
    consumers = g.consumers()
    outputs = {v.name for v in g.outputs}
    opset = g.opsets.get("", g.opsets.get("ai.onnx", 1))
    pending: dict = {}   # id(node) -> what to emit in its place (None: nothing)
    converted = 0
    # earlier passes may leave the list out of order (a fused node sits where its first
    # member was): a producer must be seen before its readers to keep their reads in NHWC
    for n in topological_order(g):
        if id(n) in pending:
            emit = pending.pop(id(n))
            if emit is not None:
                emit()
            continue
        before, made = len(rw.out), set(rw.to_nhwc)
        ok = (rw.conv(n) or rw.pointwise(n) or rw.pool(n)
              or rw.concat(n, consumers, outputs) or rw.split(n) or rw.slice_(n, opset)
              or rw.reduce(n, opset) or rw.shape(n) or rw.transpose(n)
              or rw.shuffle(n, consumers, outputs, pending))
        if ok:
            converted += 1
            continue
        del rw.out[before:]   # a rule that gave up: its conversions go too
        for name in set(rw.to_nhwc) - made:
            del rw.to_nhwc[name]
        # a border: region values this node reads go back to NCHW under their own names
        rw.out.append(n)
    if not converted:
        return graph
    if mode == "auto" and _conv_kind(graph) == "kxk":
        # a network without depthwise layers goes channels-last for its KxK convolutions'
        # sake: not when the region is so broken up that each layer would pay for its own
        # conversions (at most one conversion of an activation per two convolutions)
        convs = sum(m.op_type == "NhwcConv" for m in rw.out)
        read = {i for m in rw.out for i in m.inputs if i} | outputs
        produced = {o for m in rw.out for o in m.outputs if o}
        back = sum(name in read and name not in produced for name in rw.nhwc)
        if 2 * (len(rw.to_nhwc) + back) > convs:
            return graph
    # the conversions back: one Transpose per region value read outside the region
    read = {i for m in rw.out for i in m.inputs if i} | outputs
    final = []
    produced = {o for m in rw.out for o in m.outputs if o}
    back_after = {}
    for name, t in rw.nhwc.items():
        if name in read and name not in produced:
            back_after.setdefault(t, []).append(
                Node("Transpose", [t], [name], {"perm": list(TO_NCHW)},
                     rw.fresh(f"{name}/to_nchw"), ""))
    for m in rw.out:
        final.append(m)
        for o in m.outputs:
            final.extend(back_after.get(o, ()))
    g.nodes = chain_convs(g, final, variables, outputs)
    g.opsets = dict(g.opsets)
    g.opsets.setdefault(FUSED_DOMAIN, 1)
    return g   # every node is used: a conversion is made only for a reader


_CLIP_ACTS = ("", "Relu", "Clip")


def _attr_ints(n: Node, name: str, default):
    v = n.attrs.get(name)
    return list(default) if v is None or (hasattr(v, "__len__") and not len(v)) \
        else [int(i) for i in v]


def _chain_member(g: Graph, n: Node, variables, kind: str):
    """The constant weights of NhwcConv ``n`` when it can be the ``kind`` ("pointwise" or
    "depthwise") stage of an :func:`chain_convs` chain, else None."""
    if n.op_type != "NhwcConv" or n.domain != FUSED_DOMAIN or len(n.outputs) != 1:
        return None
    ins = list(n.inputs) + [""] * (4 - len(n.inputs))
    w = g.initializers.get(ins[1]) if ins[1] not in variables else None
    b = ins[2]
    if w is None or (b and (b in variables or b not in g.initializers)):
        return None
    w = np.asarray(w)
    act = n.attrs.get("activation", "")
    act = act.decode() if isinstance(act, bytes) else act
    auto = n.attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if w.dtype != np.float32 or w.ndim != 4 or act not in _CLIP_ACTS \
            or auto not in ("NOTSET", "", "VALID") \
            or _attr_ints(n, "dilations", (1, 1)) != [1, 1]:
        return None
    if kind == "pointwise":
        ok = w.shape[:2] == (1, 1) and int(n.attrs.get("group", 1)) == 1 \
            and _attr_ints(n, "strides", (1, 1)) == [1, 1] \
            and not any(_attr_ints(n, "pads", (0, 0, 0, 0)))
    else:
        st = _attr_ints(n, "strides", (1, 1))
        ok = w.shape[:3] == (3, 3, 1) and int(n.attrs.get("group", 1)) == w.shape[3] \
            and st in ([1, 1], [2, 2]) and not ins[3]
    return w if ok else None


def chain_convs(g: Graph, nodes: list, variables=frozenset(), outputs=frozenset()) -> list:
    """``nodes`` with each inverted-residual chain of channels-last convolutions — a 1x1
    expand (optional) -> a depthwise 3x3 (stride 1 or 2) -> a 1x1 project (optional; its
    residual kept), at least two of the three, constant float32 weights, clip-like
    activations (none, Relu, Clip), the values between them read by nothing else — as one
    ``NhwcConvChain`` node in the last member's place (its inputs exist there)."""
    readers: dict = {}
    for m in nodes:
        for i in m.inputs:
            if i:
                readers.setdefault(i, []).append(m)
    producer = {o: m for m in nodes for o in m.outputs if o}

    def only_reader(value):
        r = readers.get(value, [])
        return r[0] if len(r) == 1 and value not in outputs else None

    def act(m):
        a = m.attrs.get("activation", "")
        return (a.decode() if isinstance(a, bytes) else a,
                [float(v) for v in (m.attrs.get("activation_params") or ())])

    fused: dict = {}   # id(last member) -> the chain node
    gone: set = set()
    for d in nodes:
        if _chain_member(g, d, variables, "depthwise") is None:
            continue
        e = producer.get(d.inputs[0])
        if e is None or id(e) in gone or only_reader(d.inputs[0]) is not d \
                or _chain_member(g, e, variables, "pointwise") is None \
                or (len(e.inputs) > 3 and e.inputs[3]):
            e = None
        p = only_reader(d.outputs[0])
        if p is None or p.inputs[0] != d.outputs[0] \
                or _chain_member(g, p, variables, "pointwise") is None:
            p = None
        if e is None and p is None:
            continue
        eins = (list(e.inputs) + [""] * 3)[:3] if e is not None else ["", "", ""]
        pins = (list(p.inputs) + [""] * 4)[:4] if p is not None else ["", "", "", ""]
        x = eins[0] if e is not None else d.inputs[0]
        dins = list(d.inputs) + [""] * 3
        members = [m for m in (e, d, p) if m is not None]
        ea, da, pa = (act(m) if m is not None else ("", []) for m in (e, d, p))
        attrs = {"strides": _attr_ints(d, "strides", (1, 1)),
                 "pads": _attr_ints(d, "pads", (0, 0, 0, 0)),
                 "auto_pad": "NOTSET" if d.attrs.get("auto_pad") in (None, "", b"")
                 else d.attrs["auto_pad"],
                 "expand_activation": ea[0], "expand_params": ea[1],
                 "dw_activation": da[0], "dw_params": da[1],
                 "project_activation": pa[0], "project_params": pa[1]}
        # an empty list has no ONNX attribute type (to_proto): absent is the default
        attrs = {k: v for k, v in attrs.items() if not isinstance(v, list) or v}
        node = Node("NhwcConvChain", [x, eins[1], eins[2], dins[1], dins[2], pins[1],
                                      pins[2], pins[3]],
                    [members[-1].outputs[0]], attrs, "+".join(m.name for m in members),
                    FUSED_DOMAIN, "")
        fused[id(members[-1])] = node
        gone.update(id(m) for m in members)
    if not fused:
        return nodes
    nodes = [fused[id(m)] if id(m) in fused else m for m in nodes if id(m) in fused
             or id(m) not in gone]
    return _chain_into_shuffles(nodes, outputs)


def _chain_into_shuffles(nodes: list, outputs) -> list:
    """ShuffleNet's ``NhwcConcatShuffle(a, b, groups=2)`` where ``b`` (else ``a``) is a
    chain's result (with a 1x1 project) read by nothing else: the chain takes the other half
    as its input ``I`` and writes each band straight into its shuffled places, in the
    concat's place (the chain's result never exists whole; checked at run time, else the
    same two steps run)."""
    readers: dict = {}
    for m in nodes:
        for i in m.inputs:
            if i:
                readers.setdefault(i, []).append(m)
    producer = {o: m for m in nodes for o in m.outputs if o}
    done: dict = {}   # id(concat) -> the chain node that replaces it
    gone: set = set()
    for c in nodes:
        if c.op_type != "NhwcConcatShuffle" or c.domain != FUSED_DOMAIN \
                or int(c.attrs.get("groups", 1)) != 2 or len(c.inputs) != 2 \
                or not all(c.inputs):
            continue
        for pos in (1, 0):
            v = c.inputs[pos]
            ch = producer.get(v)
            if ch is None or ch.op_type != "NhwcConvChain" or id(ch) in gone \
                    or len(ch.inputs) < 6 or not ch.inputs[5] \
                    or (len(ch.inputs) > 8 and ch.inputs[8]) \
                    or v in outputs or len(readers.get(v, [])) != 1:
                continue
            ins = (list(ch.inputs) + [""] * 8)[:8] + [c.inputs[1 - pos]]
            attrs = dict(ch.attrs, interleave_first=int(pos == 1))
            done[id(c)] = Node("NhwcConvChain", ins, list(c.outputs), attrs,
                               f"{ch.name}+{c.name}", FUSED_DOMAIN, "")
            gone.add(id(ch))
            break
    if not done:
        return nodes
    return [done.get(id(m), m) for m in nodes if id(m) not in gone]
