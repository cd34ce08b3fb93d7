"""A node-by-node evaluator of a graph that is being rewritten (used by re-shape).

It keeps every value of the graph for several input configurations at once (the old shapes
and a probe at the new ones), computes nodes one at a time in the engine
(``workbench.backend.run_node``; a node with subgraphs runs as a small model through
``backend.prepare``), and, when the graph changes under it, forgets only what depends on the
changed nodes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from workbench.edit.state import Draft, free_names, subgraphs
from workbench.graph.external import tensor_to_array


class NodeFailed(Exception):
    def __init__(self, node: onnx.NodeProto, config: str, error: BaseException):
        self.node, self.config, self.error = node, config, error
        super().__init__(str(error))


class Evaluator:
    """Values of ``d``'s graph for each configuration in ``feeds`` (config -> {input: array})."""

    def __init__(self, d: Draft, feeds: dict):
        self.d = d
        self.vals = {c: dict(f) for c, f in feeds.items()}
        self._consts: dict = {}

    def configs(self):
        return list(self.vals)

    def const(self, name: str):
        if name not in self._consts:
            v = self.d.constant_value(name) if name in self.d.inits else None
            self._consts[name] = v
        return self._consts[name]

    def get(self, config: str, name: str):
        if name in self.vals[config]:
            return self.vals[config][name]
        if name in self.d.inits:
            return self.const(name)
        raise KeyError(name)

    def has(self, config: str, name: str) -> bool:
        return name in self.vals[config] or name in self.d.inits

    def forget(self, names) -> None:
        for vals in self.vals.values():
            for n in names:
                vals.pop(n, None)

    def drop_constant(self, name: str) -> None:
        self._consts.pop(name, None)

    def compute(self, node: onnx.NodeProto, config: str) -> list:
        """Run ``node`` on the config's values; stores and returns its outputs."""
        vals = self.vals[config]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            out = [self.d.constant_value(node.output[0])]
        else:
            try:
                out = self._run(node, config)
            except Exception as e:  # noqa: BLE001 - reported with the node by the caller
                raise NodeFailed(node, config, e) from e
        for name, v in zip(node.output, out):
            if name:
                vals[name] = v
        return out

    def _run(self, node: onnx.NodeProto, config: str) -> list:
        import workbench.backend as backend  # noqa: PLC0415
        if any(True for _ in subgraphs(node)):
            return self._run_with_subgraphs(node, config)
        ins = [self.get(config, i) for i in node.input if i]
        opset = self.d.opset(node.domain) or self.d.opset("")
        out = backend.run_node(node, ins, opset_version=opset)
        return [np.asarray(o) if not isinstance(o, (list, dict)) else o for o in out]

    def _run_with_subgraphs(self, node, config) -> list:
        import workbench.backend as backend  # noqa: PLC0415
        from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415
        reads = [i for i in node.input if i]
        for sg in subgraphs(node):
            reads += [x for x in free_names(sg) if x not in reads]
        inputs, feeds, inits = [], {}, []
        for r in reads:
            v = self.get(config, r)
            if r in self.d.inits:
                inits.append(self.d.inits[r])
                continue
            arr = np.asarray(v)
            inputs.append(helper.make_tensor_value_info(r, onnx_dtype_of_np(arr.dtype),
                                                        list(arr.shape)))
            feeds[r] = arr
        outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        g = helper.make_graph([node], "node", inputs, outs, inits)
        m = helper.make_model(g, opset_imports=list(self.d.m.opset_import))
        m.ir_version = self.d.m.ir_version
        rep = backend.prepare(m, check=False, optimize=False)
        return list(rep.run(feeds))


def tensor_value(t: onnx.TensorProto, where: str) -> np.ndarray:
    return tensor_to_array(t, where)
