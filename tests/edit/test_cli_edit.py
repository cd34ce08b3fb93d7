"""``workbench edit`` on the command line."""

from __future__ import annotations

import onnx

from workbench.cli import main


def test_edit_command(digits, tmp_path, capsys):
    out, script = tmp_path / "m.onnx", tmp_path / "replay.py"
    rc = main(["edit", digits, "-o", str(out), "--batch", "4", "--rename", "image=pixels",
               "--add-output", "/5/Relu_output_0", "--script", str(script)])
    text = capsys.readouterr().out
    assert rc == 0 and "session.rebatch(batch=4)" in text and "runs" in text
    m = onnx.load(str(out))
    assert [i.name for i in m.graph.input] == ["pixels"]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [4, 1, 8, 8]
    assert "session.add_output(value='/5/Relu_output_0')" in script.read_text()
    # never over an existing file; a refused edit writes nothing
    rc = main(["edit", digits, "-o", str(out), "--batch", "2"])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    other = tmp_path / "n.onnx"
    rc = main(["edit", digits, "-o", str(other), "--rename", "image=logits"])
    assert rc == 2 and "name clash" in capsys.readouterr().err and not other.exists()
    rc = main(["edit", digits, "-o", str(other)])
    assert rc == 2 and "no edit given" in capsys.readouterr().err
