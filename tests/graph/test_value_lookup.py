"""``Graph.value_lookup``: the constant-time index the analysis uses answers exactly as
``Graph.value`` (inputs first, then outputs, value_info, initializers), so a graph with
thousands of inputs (a 20,000-input Concat in the viewer's budget) is analysed in linear time."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from workbench.graph.ir import Graph


def _graph():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y_as_input = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((2, 3), np.int32), "w")
    nodes = [helper.make_node("Add", ["x", "x"], ["h"]),
             helper.make_node("Identity", ["h"], ["z"]),
             helper.make_node("Identity", ["h"], ["y"])]
    g = helper.make_graph(nodes, "g", [x, y_as_input], [y, z], [w], value_info=[h])
    return Graph.from_proto(g, {"": 17})


def test_lookup_answers_as_value():
    g = _graph()
    lookup = g.value_lookup()
    for name in ("x", "y", "z", "h", "w", "nope", ""):
        a, b = g.value(name), lookup(name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert (a.name, a.dtype, tuple(a.shape or ())) == \
                (b.name, b.dtype, tuple(b.shape or ()))
    assert lookup("y").dtype == TensorProto.DOUBLE        # an input shadows an output's entry
    assert tuple(lookup("w").shape) == (2, 3)              # from the initializer
