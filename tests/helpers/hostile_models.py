"""Models from a stranger, for the security tests (tests/browser/test_xss.py,
tests/test_labext_limits.py, tests/graph/test_structure.py) and benchmarks/bench_viewer_server.py.

- :func:`xss_model`: a small valid model whose every string field carries an HTML/script
  payload (names of nodes, values, inputs, outputs, initializers; op types, domains, attribute
  names and string values, doc strings, metadata keys and values, producer, graph name,
  model-local function names). Each payload, if it ever became markup, sets ``window.__xss``
  or leaves an element carrying the ``wbxss`` marker in the page.
- :func:`fan_in_concat`: one Concat with ``n`` inputs (the quadratic case of the old drawing
  code: 20,000 inputs is a 0.6 MB file).
- :func:`write_big_initializer_model`: one Add whose initializer holds ``nbytes`` of float32
  zeros in ``raw_data``, written as a *sparse* file (the zeros are a hole: the 1 GiB file
  takes no disk space and no time to write, yet every byte of it is there to read).
- :func:`write_external_data_model`: the same with the initializer in an external file.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the marker every payload carries; no legitimate text in the tests contains it
MARK = "wbxss"


def payloads(tag: str) -> list[str]:
    """HTML/script payload variants; ``tag`` keeps them apart (which field leaked)."""
    js = f"window.__xss=(window.__xss||[]).concat('{tag}')"
    return [
        f'<img src=x class="{MARK}" onerror="{js}">',
        f'<svg class="{MARK}" onload="{js}"></svg>',
        f'<a class="{MARK}" href="javascript:{js}">click {tag}</a>',
        f'<iframe class="{MARK}" srcdoc="<script>parent.{js}</script>"></iframe>',
        f'"><script class="{MARK}">{js}</script>',
        f"' onmouseover='{js}' data-{MARK}='",
        f'" onfocus="{js}" autofocus data-{MARK}="',
        f"</textarea></style></title><img src=x class={MARK} onerror={js}>",
    ]


def _p(tag: str, k: int = 0) -> str:
    """One payload for field ``tag`` (variant k, cycling), made unique by the tag."""
    variants = payloads(tag)
    return f"{tag}{variants[k % len(variants)]}"


def xss_model() -> onnx.ModelProto:
    """A valid, runnable model (x -> Relu -> MatMul(W) -> custom-domain op inlined from a
    model-local function -> y) whose strings are payloads. onnx.checker accepts it."""
    x, w, h, r, y = (_p("input", 0), _p("init", 1), _p("value", 2), _p("fvalue", 3),
                     _p("output", 4))
    fdomain, fname = "wbxss.evil", _p("func", 5).replace(".", "_")
    relu = helper.make_node("Relu", [x], [h], name=_p("node", 0), doc_string=_p("ndoc", 1))
    mm = helper.make_node("MatMul", [h, w], [r], name=_p("node2", 2))
    call = helper.make_node(fname, [r], [y], name=_p("callnode", 3), domain=fdomain)
    fbody = [helper.make_node("Identity", ["fin"], ["fmid"], name=_p("fnode", 4)),
             helper.make_node("Relu", ["fmid"], ["fout"], name=_p("fnode2", 5))]
    func = helper.make_function(fdomain, fname, ["fin"], ["fout"], fbody,
                                [helper.make_opsetid("", 17)], doc_string=_p("fdoc", 6))
    winit = numpy_helper.from_array(np.eye(4, dtype=np.float32), w)
    winit.doc_string = _p("tdoc", 0)
    g = helper.make_graph(
        [relu, mm, call], _p("graph", 6),
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [_p("dim", 7), 4],
                                       doc_string=_p("vdoc", 1))],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [None, 4])], [winit],
        doc_string=_p("gdoc", 2))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(fdomain, 1)],
                          functions=[func], producer_name=_p("producer", 3),
                          producer_version=_p("pversion", 4), doc_string=_p("mdoc", 5),
                          domain=_p("mdomain", 6))
    m.ir_version = 8
    onnx.helper.set_model_props(m, {_p("metakey", 7): _p("metaval", 0),
                                    "author": _p("author", 1)})
    return m


def xss_custom_op_model() -> onnx.ModelProto:
    """A payload op type in a payload domain (no kernel: listed as missing) with payload
    attribute names and string values, and a Relu with an attribute Relu does not have
    (onnx.checker refuses it, quoting the payload: the viewer shows that message)."""
    op, dom = _p("optype", 2).replace(".", "_"), _p("domain", 3)
    n1 = helper.make_node(op, ["a"], ["b"], name=_p("custom", 0), domain=dom)
    n1.attribute.extend([helper.make_attribute(_p("attrname", 6), _p("attrval", 7)),
                         helper.make_attribute(_p("attrs", 1), [_p("attrlist", 2)]),
                         helper.make_attribute("s", _p("cattr", 4))])
    n2 = helper.make_node("Relu", ["b"], ["c"], name=_p("after", 5))
    n2.attribute.append(helper.make_attribute(_p("bogus", 3), 1))
    g = helper.make_graph([n1, n2], "custom",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(dom, 1)])
    m.ir_version = 8
    return m


def fan_in_concat(n: int = 20_000) -> onnx.ModelProto:
    """One Concat with ``n`` graph inputs [1, 1] -> y [n, 1]: 2n + 2 values, n edges into one
    node."""
    names = [f"x{i}" for i in range(n)]
    node = helper.make_node("Concat", names, ["y"], name="cat", axis=0)
    g = helper.make_graph([node], "fan_in",
                          [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, 1])
                           for v in names],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(field: int, payload_len: int) -> bytes:
    return _varint((field << 3) | 2) + _varint(payload_len)


def _add_model(init: onnx.TensorProto, n: int) -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add")
    g = helper.make_graph([node], "big",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
                          [init])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def write_big_initializer_model(path, nbytes: int = 2**30) -> int:
    """Write a valid model (``y = x + w``, ``w`` float32 zeros of ``nbytes`` bytes in its
    ``raw_data``) to ``path`` as a sparse file; returns the file size. The protobuf is
    assembled by hand so that the 1 GiB is never held in memory."""
    n = nbytes // 4
    head = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n])
    tensor_head = head.SerializeToString() + _len_field(9, nbytes)     # raw_data = 9
    tensor_len = len(tensor_head) + nbytes
    m = _add_model(onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[0]), n)
    del m.graph.initializer[:]
    graph_rest = m.graph.SerializeToString()
    init_field = _len_field(5, tensor_len)                              # initializer = 5
    graph_len = len(graph_rest) + len(init_field) + tensor_len
    m.ClearField("graph")
    model_rest = m.SerializeToString()
    with open(path, "wb") as f:
        f.write(model_rest + _len_field(7, graph_len) + graph_rest + init_field + tensor_head)
        f.truncate(f.tell() + nbytes)              # the zeros: a hole, not written blocks
        size = f.seek(0, os.SEEK_END)
    return size


def write_external_data_model(folder, nbytes: int = 2**30, *, location: str = "weights.bin",
                              name: str = "model.onnx", write_data: bool = True) -> str:
    """``y = x + w`` with ``w`` (float32, ``nbytes``) in the external file ``location`` of
    ``folder`` (sparse, zeros); returns the model's path."""
    n = nbytes // 4
    init = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[n])
    init.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(nbytes))):
        e = init.external_data.add()
        e.key, e.value = k, v
    m = _add_model(init, n)
    path = os.path.join(folder, name)
    onnx.save(m, path)
    if write_data:
        with open(os.path.join(folder, location), "wb") as f:
            f.truncate(nbytes)
    return path
