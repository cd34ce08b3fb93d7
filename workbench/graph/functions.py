"""Model-local functions (``ModelProto.functions``), inlined at load.

Converters write them (skl2onnx's KNNImputer, PyTorch's dynamo exporter, onnxscript): a node
whose ``(domain, op_type)`` names a function of the model is replaced by the function's body,
with the function's formal inputs/outputs bound to the node's actual values, every internal
value renamed uniquely, attribute references (``ref_attr_name``) bound to the node's attributes
or the function's defaults, and calls inside the body (also inside If/Loop/Scan bodies, at any
depth) inlined the same way. Pure protobuf work in Python: no C++ code runs on it, so a hostile
model cannot crash the process here; recursion is refused first
(:func:`workbench.graph.load.check_function_calls`).
"""

from __future__ import annotations

import onnx
from onnx import AttributeProto

from workbench.errors import ModelLoadError

# a body inlined more than this many times in total is refused (exponential fan-out)
MAX_INLINED_NODES = 5_000_000


class _Inliner:
    def __init__(self, m: onnx.ModelProto, path: str | None):
        self.funcs = {(f.domain, f.name): f for f in m.functions}
        self.path = path
        self.counter = 0
        self.nodes_made = 0

    # ---------------------------------------------------------------- graphs
    def graph(self, g: onnx.GraphProto) -> None:
        """Inline every call in ``g`` (in place), recursing into subgraphs."""
        if not self._has_calls(g):
            return
        new_nodes = []
        for n in g.node:
            new_nodes.extend(self.node(n, rename=None))
        del g.node[:]
        g.node.extend(new_nodes)

    def _has_calls(self, g: onnx.GraphProto) -> bool:
        for n in g.node:
            if (n.domain, n.op_type) in self.funcs:
                return True
            for a in n.attribute:
                if a.type == AttributeProto.GRAPH and self._has_calls(a.g):
                    return True
                if any(self._has_calls(sg) for sg in a.graphs):
                    return True
        return False

    def node(self, n: onnx.NodeProto, rename, attrs_in=None) -> list:
        """The nodes ``n`` becomes: itself (names renamed, subgraphs inlined) or a body."""
        key = (n.domain, n.op_type)
        if key in self.funcs:
            actual_in = [rename(x) if rename and x else x for x in n.input]
            actual_out = [rename(x) if rename and x else x for x in n.output]
            call_attrs = {a.name: a for a in n.attribute}
            if attrs_in is not None:   # a call inside a body: its attributes may be references
                call_attrs = {k: v for k, v in
                              ((a.name, self._bind_attr(a, attrs_in)) for a in n.attribute)
                              if v is not None}
            return self.call(self.funcs[key], actual_in, actual_out, call_attrs,
                             n.name or n.op_type)
        out = onnx.NodeProto()
        out.CopyFrom(n)
        if rename is not None:
            out.input[:] = [rename(x) if x else x for x in n.input]
            out.output[:] = [rename(x) if x else x for x in n.output]
        if attrs_in is not None or rename is not None:
            del out.attribute[:]
            for a in n.attribute:
                b = self._bind_attr(a, attrs_in) if attrs_in is not None else a
                if b is None:
                    continue
                out.attribute.append(b)
        for a in out.attribute:
            if a.type == AttributeProto.GRAPH:
                self._subgraph(a.g, rename, attrs_in)
            for sg in a.graphs:
                self._subgraph(sg, rename, attrs_in)
        return [out]

    def _subgraph(self, g: onnx.GraphProto, rename, attrs_in) -> None:
        if rename is not None:
            for v in (*g.input, *g.output, *g.value_info):
                v.name = rename(v.name)
            for t in g.initializer:
                t.name = rename(t.name)
            for st in g.sparse_initializer:
                st.values.name = rename(st.values.name)
                st.indices.name = rename(st.indices.name)
        new_nodes = []
        for n in g.node:
            new_nodes.extend(self.node(n, rename, attrs_in))
        del g.node[:]
        g.node.extend(new_nodes)

    # ---------------------------------------------------------------- calls
    def call(self, f: onnx.FunctionProto, actual_in, actual_out, call_attrs, call_name):
        self.counter += 1
        prefix = f"{call_name}__{f.name}_{self.counter}__"
        binding = {}
        for formal, actual in zip(f.input, actual_in):
            binding[formal] = actual
        for formal in list(f.input)[len(actual_in):]:
            binding[formal] = ""          # an omitted optional input
        for formal, actual in zip(f.output, actual_out):
            binding[formal] = actual

        def rename(name: str) -> str:
            if name in binding:
                return binding[name]
            return prefix + name

        attrs = {}
        for a in f.attribute_proto:          # defaults
            attrs[a.name] = a
        attrs.update(call_attrs)
        body = []
        for n in f.node:
            body.extend(self.node(n, rename, attrs))
        self.nodes_made += len(body)
        if self.nodes_made > MAX_INLINED_NODES:
            raise ModelLoadError(
                f"inlining the model-local functions makes more than {MAX_INLINED_NODES:,} "
                f"nodes; refusing", path=self.path)
        # outputs the body never wrote (optional) are simply absent, as onnx intends
        return body

    @staticmethod
    def _bind_attr(a: onnx.AttributeProto, attrs_in: dict):
        if not a.ref_attr_name:
            return a
        src = attrs_in.get(a.ref_attr_name)
        if src is None:
            return None          # not given and no default: the attribute is absent
        b = onnx.AttributeProto()
        b.CopyFrom(src)
        b.name = a.name
        return b


def inline_functions(m: onnx.ModelProto, path: str | None = None) -> None:
    """Inline every call of a model-local function in ``m`` (in place): the main graph and
    every subgraph. The functions stay listed on the model (harmless, and kept for export)."""
    if not m.functions:
        return
    _Inliner(m, path).graph(m.graph)
