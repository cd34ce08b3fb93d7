"""Model surgery in a drawing, on the Python side: the actions a viewer offers
(workbench/widgets/editing.py: each one's edit record, its refusals), the drawing of an
edited model (edit references, the values edges carry, the marks of the last change), and
the notebook's ModelEditor (its messages, Compare, redrawing after code edits). The browser
side is tests/browser/test_edit_view.py."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import synth
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import hostile_models as hm
from workbench import edit
from workbench.widgets.editing import (
    ACTIONS,
    EditController,
    drawing_of,
    parse_attrs,
    parse_dims,
)


def _ctl(model=None, **kw):
    s = edit.open(model if model is not None else synth.mlp(), **kw)
    return s, EditController(s, name="mlp")


def _act(ctl, action, target, **params):
    return ctl.handle({"op": "action", "action": action, "target": target, "params": params})


def _node(ref):
    return {"kind": "node", "ref": ref}


def _value(v, kind="value"):
    return {"kind": kind, "value": v}


def test_actions_are_json_and_complete():
    json.dumps(ACTIONS)
    ids = [a["id"] for a in ACTIONS]
    assert len(ids) == len(set(ids))
    ctl = _ctl()[1]
    for a in ACTIONS:                   # every action has its translation into a record
        assert callable(getattr(ctl, f"_rec_{a['id']}")), a["id"]
        assert set(a["on"]) <= {"node", "input", "output", "value", "values", "model"}
    # the brief's actions are all there
    for need in ("delete", "delete_downstream", "bypass", "insert", "replace", "rename_node",
                 "rename_value", "add_output", "remove_output", "set_dims", "rebatch",
                 "extract", "cut_after", "cut_before", "cut_after_node", "cut_before_node"):
        assert need in ids


@pytest.mark.parametrize("action,target,params,want", [
    ("bypass", _node("relu1"), {}, {"edit": "bypass_node", "args": {"node": "relu1"}}),
    ("replace", _node("softmax"), {"op_type": "LogSoftmax", "attrs": "axis=1"},
     {"edit": "replace_node", "args": {"node": "softmax", "op_type": "LogSoftmax",
                                       "attrs": {"axis": 1}}}),
    ("rename_node", _node("fc1"), {"new": "first layer"},
     {"edit": "rename_node", "args": {"node": "fc1", "new": "first layer"}}),
    ("add_output_node", _node("relu1"), {}, {"edit": "add_output", "args": {"value": "h3"}}),
    ("cut_after_node", _node("fc2"), {}, {"edit": "cut_after", "args": {"values": ["h4"]}}),
    ("cut_before_node", _node("fc2"), {}, {"edit": "cut_before", "args": {"values": ["h3"]}}),
    ("insert", _value("h3"), {"op_type": "LeakyRelu", "attrs": '{"alpha": 0.25}', "name": ""},
     {"edit": "insert_node", "args": {"value": "h3", "op_type": "LeakyRelu",
                                      "attrs": {"alpha": 0.25}}}),
    ("add_output", _value("h2"), {"name": "pre_relu"},
     {"edit": "add_output", "args": {"value": "h2", "name": "pre_relu"}}),
    ("rename_value", _value("h3"), {"new": "hidden"},
     {"edit": "rename_value", "args": {"old": "h3", "new": "hidden"}}),
    ("rename_value", _value("x", "input"), {"new": "features"},
     {"edit": "rename_input", "args": {"old": "x", "new": "features"}}),
    ("rename_value", _value("y", "output"), {"new": "probs"},
     {"edit": "rename_output", "args": {"old": "y", "new": "probs"}}),
    ("set_dims", _value("x", "input"), {"dims": "batch, 8"},
     {"edit": "set_dims", "args": {"value": "x", "dims": ["batch", 8]}}),
    ("cut_after", _value("h3"), {}, {"edit": "cut_after", "args": {"values": ["h3"]}}),
    ("cut_before", _value("h3"), {}, {"edit": "cut_before", "args": {"values": ["h3"]}}),
    ("extract", {"kind": "values", "values": ["h4", "h2"]}, {},      # ordered by the graph
     {"edit": "extract", "args": {"inputs": ["h2"], "outputs": ["h4"]}}),
    ("rebatch", {"kind": "model"}, {"batch": "4"}, {"edit": "rebatch", "args": {"batch": 4}}),
    ("set_metadata", {"kind": "model"}, {"key": "author", "value": "me"},
     {"edit": "set_metadata", "args": {"key": "author", "value": "me"}}),
])
def test_an_action_is_one_checked_edit(action, target, params, want):
    s, ctl = _ctl()
    r = _act(ctl, action, target, **params)
    assert r["ok"], r
    assert r["changed"] and r["state"]["steps"][-1]["call"] == s.steps[-1].call()
    assert s.records() == [want]
    json.dumps(r)
    # undo and redo through the same requests
    assert ctl.handle({"op": "undo"})["state"]["can_redo"]
    assert s.records() == []
    assert ctl.handle({"op": "redo"})["ok"] and s.records() == [want]


def test_remove_output_delete_downstream_and_opset():
    s, ctl = _ctl()
    assert _act(ctl, "add_output", _value("h3"))["ok"]
    assert _act(ctl, "remove_output", _value("h3", "output"))["ok"]
    assert [o.name for o in s.model.graph.output] == ["y"]
    assert "every graph output" in _act(ctl, "delete_downstream", _node("fc2"))["error"]
    assert _act(ctl, "add_output", _value("h3"))["ok"]
    assert _act(ctl, "delete_downstream", _node("fc2"))["ok"]
    assert s.records()[-1] == {"edit": "delete_node", "args": {"node": "fc2",
                                                               "downstream": True}}
    assert [o.name for o in s.model.graph.output] == ["h3"]
    r = _act(ctl, "set_opset", {"kind": "model"}, version="18")
    assert r["ok"], r
    assert r["state"]["opset"] == 18


def test_compose_paths_go_through_resolve(tmp_path):
    pre = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["raw", "two"], ["x"])], "pre",
        [helper.make_tensor_value_info("raw", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(pre, str(tmp_path / "pre.onnx"))
    asked = []

    def resolve(path, purpose):
        asked.append((path, purpose))
        if ".." in path:
            raise edit.EditError(f"{path}: outside the root")
        return str(tmp_path / path)
    s = edit.open(synth.mlp())
    ctl = EditController(s, resolve=resolve)
    r = _act(ctl, "compose", {"kind": "model"}, path="../pre.onnx", connect="x=x",
             prefix="pre/", before=True)
    assert not r["ok"] and "outside the root" in r["error"] and not s.steps
    r = _act(ctl, "compose", {"kind": "model"}, path="pre.onnx", connect="x=x",
             prefix="pre/", before=True)
    assert r["ok"], r
    assert asked[-1] == ("pre.onnx", "model")
    assert s.records()[0]["args"]["other"] == {"__model__": {"path": str(tmp_path / "pre.onnx")}}
    assert [i.name for i in s.model.graph.input] == ["pre/raw"]
    # a raw record is confined the same way
    r = ctl.handle({"op": "apply", "record": {"edit": "compose", "args": {
        "other": {"__model__": {"path": "../../etc/passwd"}}, "connect": {"a": "b"}}}})
    assert not r["ok"] and "outside the root" in r["error"]


@pytest.mark.parametrize("action,target,params,words", [
    ("delete", _node("fc1"), {}, "cannot be deleted"),
    ("bypass", _node("no such node"), {}, "no node named"),
    ("rename_node", _node("fc1"), {"new": "fc2"}, "fc2"),
    ("rename_value", _value("h3"), {"new": ""}, "the new name is needed"),
    ("replace", _node("fc1"), {"op_type": "MatMul"}, "nothing to change"),
    ("replace", _node("fc1"), {"attrs": "alpha"}, "has no '='"),
    ("replace", _node("fc1"), {"attrs": "{not json"}, "not a JSON object"),
    ("insert", _value("h3"), {"op_type": ""}, "op type is needed"),
    ("set_dims", _value("x", "input"), {"dims": "3, 9"}, "9"),         # cannot work
    ("extract", {"kind": "values", "values": ["h3"]}, {}, "two different values"),
    ("extract", {"kind": "values", "values": ["h3", "h3"]}, {}, "two different values"),
    ("set_opset", {"kind": "model"}, {"version": "seventeen"}, "whole number"),
    ("bypass", {"kind": "value", "value": "h3"}, {}, "applies to node"),
    ("bypass", _node(""), {}, "cannot be edited here"),
    ("no_such_action", _node("fc1"), {}, "unknown action"),
    ("compose", {"kind": "model"}, {"path": "x.onnx", "connect": "x"}, "output=input"),
])
def test_a_refused_action_says_why_and_changes_nothing(action, target, params, words):
    s, ctl = _ctl(check="run", inputs={"x": np.ones((3, 8), np.float32)})
    before = s.model.SerializeToString(deterministic=True)
    r = _act(ctl, action, target, **params)
    assert r["ok"] is False and words in r["error"], r
    assert not s.steps and s.model.SerializeToString(deterministic=True) == before
    json.dumps(r)


def test_bad_requests():
    _, ctl = _ctl()
    assert "unknown request" in ctl.handle({"op": "explode"})["error"]
    assert "unknown request" in ctl.handle({"op": "__class__"})["error"]
    assert "JSON object" in ctl.handle([1, 2])["error"]
    assert "nothing to undo" in ctl.handle({"op": "undo"})["error"]
    assert "nothing to redo" in ctl.handle({"op": "redo"})["error"]
    assert "nothing to compare" in ctl.handle({"op": "compare"})["error"]
    assert "needs a record" in ctl.handle({"op": "apply"})["error"]
    assert "unknown edit" in ctl.handle({"op": "apply", "record": {"edit": "rm_rf"}})["error"]


def test_parsers():
    assert parse_attrs("s=\"a;b\"; axes=[0, 1]; m='x;y'") == {"s": "a;b", "axes": [0, 1],
                                                             "m": "x;y"}
    assert parse_attrs("alpha=0.1; axes=[0, 1]\nmode=constant") == {
        "alpha": 0.1, "axes": [0, 1], "mode": "constant"}
    assert parse_attrs('{"perm": [0, 2, 1]}') == {"perm": [0, 2, 1]}
    assert parse_attrs(None) is None and parse_attrs("  ;  ") is None
    assert parse_dims("batch, 3, ?, 224") == ["batch", 3, None, 224]
    assert parse_dims("[1, 'seq']") == [1, "seq"]


def test_drawing_names_nodes_for_edits():
    """Unnamed nodes and nodes sharing a name are named by their first output; nodes of a
    subgraph (an If branch) are not editable here; every edge says what value it carries."""
    then = helper.make_graph([helper.make_node("Neg", ["a"], ["t"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["a"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["b"], name="dup"),
             helper.make_node("Tanh", ["b"], ["c"], name="dup"),
             helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then,
                              else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                          [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = edit.open(m)
    ctl = EditController(s)
    d = ctl.drawing().data
    ref = dict(zip(d["name"], d["ref"]))
    assert ref["Relu_0"] == "a"                   # unnamed: its output
    refs_dup = [r for n, r in zip(d["name"], d["ref"]) if n == "dup"]
    assert refs_dup == ["b", "c"]                 # a shared name: each by its output
    assert ref["sum"] == "sum" and ref["branch"] == "branch" and ref["x"] == "x"
    assert ref["inner"] == ""                     # inside the If
    assert len(d["evalue"]) * 3 == len(d["edges"])
    assert set(d["evalue"]) >= {"x", "a", "b", "c", "s", "cond", "y"}
    r = _act(ctl, "bypass", _node("c"))            # the second "dup", by its output
    assert r["ok"], r
    assert [n.op_type for n in s.model.graph.node][:3] == ["Relu", "Sigmoid", "ReduceSum"]
    r = _act(ctl, "bypass", _node(ref["inner"]))
    assert not r["ok"] and "If/Loop/Scan" in r["error"]


def test_marks_follow_the_last_change():
    s, ctl = _ctl()
    _act(ctl, "insert", _value("h3"), op_type="Neg")
    d = ctl.drawing().data
    added = [d["name"][i] for i in d["marks"]["added"]]
    changed = [d["name"][i] for i in d["marks"]["changed"]]
    assert added == ["h3/Neg"] and changed == ["fc2"] and d["marks"]["removed"] == []
    ctl.handle({"op": "undo"})
    assert _act(ctl, "add_output", _value("h3"))["ok"]
    assert _act(ctl, "delete_downstream", _node("fc2"))["ok"]
    d = ctl.drawing().data
    assert d["marks"]["removed"] == ["fc2", "fc2_bias", "softmax"]
    assert d["marks"]["removed_count"] == 3
    ctl.handle({"op": "undo"})                    # what the undone step removed is back
    d = ctl.drawing().data
    assert sorted(d["name"][i] for i in d["marks"]["added"]) == ["fc2", "fc2_bias", "softmax"]
    assert ctl.state()["last"]["what"] == "undo"


def test_structure_only_drawing_matches_the_full_one():
    """The JupyterLab worker draws without converting the weights again: the same drawing."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")  # 16 KiB
    b = numpy_helper.from_array(np.zeros(64, np.float32), "b")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                           helper.make_node("Add", ["h", "b"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])],
                          [w, b])
    s = edit.open(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    state = s.state_at(-1)
    full, light = drawing_of(state, weights=True), drawing_of(state, weights=False)
    assert "W" not in [v.name for v in light.graph.inputs]
    for k in ("name", "op", "kind", "edges", "labels", "host", "params", "ref", "evalue"):
        assert full.data[k] == light.data[k], k
    assert light.details().of("mm") == full.details().of("mm")


def test_script_save_and_compare(tmp_path):
    s, ctl = _ctl()
    ctl.default_save = str(tmp_path / "out.onnx")
    assert ctl.state()["unsaved"] is False
    _act(ctl, "bypass", _node("relu1"))
    assert ctl.state()["unsaved"] is True
    assert "session.bypass_node(node='relu1')" in ctl.handle({"op": "script"})["script"]
    r = ctl.handle({"op": "save"})
    assert r["ok"] and ctl.state()["unsaved"] is False
    assert len(onnx.load(str(tmp_path / "out.onnx")).graph.node) == 5
    r = ctl.handle({"op": "save"})                # exists: the viewer asks first
    assert r["ok"] is False and r["exists"] is True and "exists already" in r["error"]
    _act(ctl, "bypass", _node("softmax"))
    assert ctl.handle({"op": "save", "overwrite": True})["ok"]
    assert len(onnx.load(str(tmp_path / "out.onnx")).graph.node) == 4
    assert not [p for p in tmp_path.iterdir() if p.name != "out.onnx"]    # atomic: no debris
    c = ctl.handle({"op": "compare", "against": "original"})["compare"]
    assert c["titles"] == ["original", "now"]
    assert sorted(c["only_left"]) == ["relu1", "softmax"] and c["only_right"] == []
    c = ctl.handle({"op": "compare", "against": 2})["compare"]
    assert c["only_left"] == ["softmax"]
    assert "compare against" in ctl.handle({"op": "compare", "against": 9})["error"]
    json.dumps(c)


def test_session_versions_and_listeners():
    s = edit.open(synth.mlp())
    seen = []
    s.on_change(lambda sess, what, step: seen.append((what, step.index)))
    s.bypass_node("relu1")
    s.rename_value("h4", "z")
    assert len(s.model_at(0).graph.node) == 6 and len(s.model_at(-1).graph.node) == 5
    assert s.model_at(1).SerializeToString() == s.model_at(-2).SerializeToString()
    s.undo()
    assert [st.index for st in s.undone] == [2]
    assert s.model_at(-1).SerializeToString() == s.model_at(1).SerializeToString()
    with pytest.raises(edit.EditError, match="versions 0 .. 1"):
        s.model_at(2)
    with pytest.raises(edit.EditError, match="an int"):
        s.model_at("1")
    s.redo()
    assert seen == [("apply", 1), ("apply", 2), ("undo", 2), ("redo", 2)]

    def broken(*a):
        raise RuntimeError("viewer gone")
    s.on_change(broken)
    with pytest.warns(RuntimeWarning, match="viewer gone"):
        s.bypass_node("softmax")
    assert len(s.steps) == 3                      # the edit stands
    s.on_change(broken, remove=True)
    s.undo()


def test_hostile_names_stay_data():
    """A model whose every string is an HTML payload: the controller's answers carry the
    names as data (JSON strings), the script as repr'd literals."""
    m = hm.xss_model()
    s = edit.open(m, check="static")
    ctl = EditController(s, name=m.graph.name)
    d = ctl.drawing().data
    node = next(r for r, k in zip(d["ref"], d["kind"]) if k == 0 and r)
    r = _act(ctl, "rename_node", _node(node), new=hm._p("renamed", 1))
    assert r["ok"], r
    r = _act(ctl, "rename_node", _node(hm._p("renamed", 1)), new=node)
    assert r["ok"], r
    err = _act(ctl, "bypass", _node(hm._p("nothere", 2)))["error"]
    assert "nothere" in err                       # the payload is quoted in the message text
    script = ctl.handle({"op": "script"})["script"]
    compile(script, "<script>", "exec")
    assert "window.__xss" in script               # as a string literal, not code
    json.dumps(ctl.state())


# ---------------------------------------------------------------------------- ModelEditor
def _editor(model=None, **kw):
    from workbench.widgets import ModelEditor
    ed = ModelEditor(model if model is not None else synth.mlp(), **kw)
    sent = []
    ed.view.send = lambda content, buffers=None: sent.append(content)
    return ed, sent


def _msg(ed, request, mid="1"):
    ed._on_msg(ed.view, {"type": "wb-edit", "id": mid, "request": request}, [])


def test_model_editor_messages():
    ed, sent = _editor(save_to="never.onnx")
    assert ed.view.editable and ed.view.edit_state["actions"] == ACTIONS
    assert ed.view.graph_data["ref"] and ed.view.graph_data["evalue"]
    _msg(ed, {"op": "action", "action": "bypass", "target": _node("relu1")}, "a")
    reply = sent[-1]
    assert reply == {"type": "wb-edit-reply", "id": "a", "reply": {"ok": True, "changed": True}}
    assert len(ed.session.steps) == 1 and "relu1" not in ed.view.graph_data["name"]
    assert ed.view.edit_state["last"]["call"] == "session.bypass_node(node='relu1')"
    assert ed.view.edit_state["save_path"] == "never.onnx"
    _msg(ed, {"op": "action", "action": "delete", "target": _node("fc1")}, "b")
    assert sent[-1]["reply"]["ok"] is False and "cannot be deleted" in sent[-1]["reply"]["error"]
    ed.view.selected = "fc2"                      # details still answer selections
    assert ed.view.details["op"] == "MatMul"
    _msg(ed, {"op": "compare"}, "c")
    assert sent[-1]["reply"]["ok"]
    close, cmp = ed.compare_box.children
    assert cmp.only_left == ["relu1"]
    close.click()
    assert ed.compare_box.children == ()
    # an edit made in code redraws the editor too
    ed.session.rename_value("h4", "scores")
    assert "scores" in ed.view.graph_data["evalue"]
    assert ed.view.edit_state["steps"][-1]["edit"] == "rename_value"
    ed._on_msg(ed.view, {"type": "something else"}, [])         # not ours: ignored
    assert "ModelEditor('mlp'" in repr(ed) and "2 edit(s)" in repr(ed)


def test_model_editor_on_an_existing_session():
    from workbench.widgets import ModelEditor
    s = edit.open(synth.mlp())
    s.bypass_node("relu1")
    ed = ModelEditor(s)
    assert ed.session is s and ed.view.edit_state["can_undo"]
    assert ed.view.edit_state["save_path"] == "edited.onnx"
