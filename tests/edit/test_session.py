"""The session: undo/redo, the replay script, records as JSON, saving, hostile names."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.edit.conftest import model_bytes
from workbench import edit
from workbench.edit import EditError
from workbench.errors import OverwriteError


def _edits(s):
    s.rename_value("image", "pixels")
    s.add_output("/5/Relu_output_0", name="features")
    s.insert_node("logits", "Softmax", attrs={"axis": 1})
    s.set_initializer("12.bias", np.linspace(-1, 1, 10, dtype=np.float32))
    s.set_metadata("note", "edited")
    s.rebatch("N")


def test_undo_redo(digits):
    s = edit.open(digits)
    original = model_bytes(s)
    _edits(s)
    states = [model_bytes(s)]
    assert len(s.steps) == 6 and s.can_undo() and not s.can_redo()
    undone = s.undo()
    assert undone.edit == "rebatch" and len(s.steps) == 5 and s.can_redo()
    s.redo()
    assert model_bytes(s) == states[0]
    for _ in range(6):
        s.undo()
    assert model_bytes(s) == original and not s.can_undo()
    with pytest.raises(EditError, match="nothing to undo"):
        s.undo()
    s.redo()
    s.rename_value("/0/Conv_output_0", "conv0")   # a new edit drops what was undone
    assert not s.can_redo() and [x.edit for x in s.steps] == ["rename_value", "rename_value"]


def test_script_replays_on_the_original_file(digits):
    s = edit.open(digits)
    _edits(s)
    s.undo()                                  # undone edits are not in the script
    code = s.script()
    assert "rebatch" not in code and code.count("session.") == 5 + 1
    assert f"edit.open({digits!r})" in code
    ns: dict = {}
    exec(compile(code, "replay.py", "exec"), ns)
    assert ns["model"].SerializeToString(deterministic=True) == model_bytes(s)
    # the same records sent as JSON (what a viewer sends) give the same model
    records = json.loads(json.dumps(s.records()))
    s2 = edit.open(digits)
    for r in records:
        s2.apply(r)
    assert model_bytes(s2) == model_bytes(s)
    assert json.loads(json.dumps([st.to_dict() for st in s.steps]))[0]["check"]["ok"]


def test_records_are_validated(digits):
    s = edit.open(digits)
    with pytest.raises(EditError, match="unknown edit 'explode'; the edits are: add_output"):
        s.apply({"edit": "explode", "args": {}})
    with pytest.raises(EditError, match="has no argument 'colour'"):
        s.apply({"edit": "delete_node", "args": {"node": "/2/Relu", "colour": 1}})
    with pytest.raises(EditError, match="needs the argument"):
        s.apply({"edit": "delete_node", "args": {}})
    with pytest.raises(EditError, match="unknown record field"):
        s.apply({"edit": "delete_node", "args": {"node": "x"}, "eval": "1"})
    with pytest.raises(EditError, match="check is one of"):
        s.apply({"edit": "set_metadata", "args": {"key": "a", "value": "b"}, "check": "none"})
    with pytest.raises(EditError, match="needs 4 bytes"):
        s.apply({"edit": "set_initializer", "args": {"name": "12.bias", "value": {
            "__array__": {"dtype": "float32", "shape": [1], "base64": ""}}}})
    step = s.apply({"edit": "set_metadata", "args": {"key": "a", "value": "b"},
                    "check": "static"})
    assert step.check.ran is None and "check='static'" in s.script()
    big = np.arange(1000, dtype=np.float32).reshape(10, 100)
    s.apply({"edit": "set_initializer", "args": {
        "name": "12.weight", "value": {"__array__": {
            "dtype": "float32", "shape": [10, 32],
            "base64": __import__("base64").b64encode(big.ravel()[:320].tobytes()).decode()}}}})
    ns: dict = {}
    exec(s.script(), ns)   # a big array goes into the script as base64
    assert ns["model"].SerializeToString(deterministic=True) == model_bytes(s)


def _hostile_model():
    evil = "x'); __import__('os').system('touch PWNED') #"
    evil2 = '<img src=x onerror=alert(1)>"\n\\'
    n1 = helper.make_node("Relu", [evil], [evil2], name=evil2)
    n2 = helper.make_node("Identity", [evil2], ["out"], name="id")
    g = helper.make_graph([n1, n2], "g",
                          [helper.make_tensor_value_info(evil, TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), evil, evil2


def test_hostile_names_cannot_inject_code_or_html(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m, evil, evil2 = _hostile_model()
    s = edit.open(m)
    s.rename_value(evil2, evil2 + "'''\"\"\"")
    s.bypass_node("id")
    s.rename_input(evil, evil + "\n__import__('os').system('touch PWNED2')")
    s.set_metadata(evil, evil2)
    code = s.script()
    ns = {"original": m}
    exec(compile(code, "replay.py", "exec"), ns)
    assert not os.path.exists("PWNED") and not os.path.exists("PWNED2")
    assert ns["model"].SerializeToString(deterministic=True) == model_bytes(s)
    html = s._repr_html_()
    assert "<img" not in html and "&lt;img" in html
    # the names are shown escaped in the text repr, never executed or interpreted
    assert "onerror" in repr(s)


def test_save_is_atomic_and_never_overwrites(digits, tmp_path):
    s = edit.open(digits)
    s.rebatch(2)
    path = tmp_path / "m.onnx"
    s.save(path)
    with pytest.raises(OverwriteError, match="overwrite=True"):
        s.save(path)
    s.set_metadata("v", "2")
    s.save(path, overwrite=True)
    assert {p.key for p in onnx.load(str(path)).metadata_props} == {"v"}
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []
    # external data: the weights beside the file, loaded back through the workbench
    ext = tmp_path / "ext.onnx"
    s.save(ext, external_data=True)
    assert (tmp_path / "ext.onnx.data").exists()
    back = edit.open(str(ext)).model
    here = s.model
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in here.graph.initializer}
    for t in back.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), inits.pop(t.name))
    assert not inits
    del back.graph.initializer[:], here.graph.initializer[:]
    assert back.SerializeToString(deterministic=True) == here.SerializeToString(
        deterministic=True)
    with pytest.raises(OverwriteError):
        s.save(ext, external_data=True)
    with pytest.raises(EditError, match="is a folder"):
        s.save(tmp_path)


def test_static_mode_and_bad_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(EditError, match="cannot open the model for editing"):
        edit.open(str(bad))
    with pytest.raises(EditError, match="check is one of"):
        edit.open(_hostile_model()[0], check="never")


def test_changes_name_a_renamed_node_as_changed():
    """What a step reports for a viewer to mark: a renamed node is one node changed (not one
    removed and one added); a bypassed node is removed and its reader changed."""
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "widgets"))
    import synth  # noqa: PLC0415
    s = edit.open(synth.mlp(), check="static")
    ch = s.rename_node("relu1", "act").changes
    assert (ch["nodes_added"], ch["nodes_removed"], ch["nodes_changed"]) == ([], [], ["act"])
    ch = s.bypass_node("act").changes
    assert (ch["nodes_added"], ch["nodes_removed"], ch["nodes_changed"]) == ([], ["act"], ["fc2"])
    assert ch["outputs"] == {"before": ["y"], "after": ["y"]}
