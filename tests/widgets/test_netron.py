import gc
import os
import threading
import urllib.request

import pytest
import synth

netron_pkg = pytest.importorskip("netron")

from workbench.widgets import netron, view_main  # noqa: E402


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


def test_serves_a_proto_on_localhost_and_stops():
    view = netron(synth.mlp())
    try:
        assert view.address[0] == "127.0.0.1" and view.address[1] > 0
        assert view.url.startswith("http://127.0.0.1:")
        status, body = _get(view.url)
        assert status == 200 and b"<html" in body.lower()
        assert os.path.isfile(view.path) and view.path.endswith(".onnx")
        assert view.running
        assert 'src="http://127.0.0.1:' in view._repr_html_()
        assert "serving" in repr(view)
    finally:
        view.close()
    assert not view.running and not os.path.exists(view.path)
    with pytest.raises(OSError):
        _get(view.url)
    view.close()                                     # closing twice is fine
    assert "stopped" in repr(view)


def test_path_and_garbage_collection(tmp_path):
    import onnx
    p = tmp_path / "m.onnx"
    onnx.save(synth.mlp(), p)
    view = netron(str(p))
    address = view.address
    assert view.path == str(p)
    assert netron_pkg.status(address)
    del view
    gc.collect()
    assert not netron_pkg.status(address)
    assert p.exists()                                # the user's file is never removed


def test_a_hostile_file_name_is_served_under_a_plain_one(tmp_path):
    """Netron's server writes the file name unescaped into its page and its data URL: a name
    with markup is served through a link with a plain name (the model then loads, and no
    markup reaches Netron's page); the user's file stays where it is."""
    import onnx
    evil = tmp_path / '<img src=x onerror="window.__xss=1">.onnx'
    onnx.save(synth.mlp(), evil)
    view = netron(str(evil))
    try:
        name = os.path.basename(view.path)
        assert name.endswith(".onnx") and all(c.isalnum() or c in "._-" for c in name)
        assert os.path.samefile(view.path, evil)
        status, page = _get(view.url)
        assert status == 200 and b"<img" not in page and b'onerror="' not in page
        status, data = _get(view.url + "data/" + name)
        assert status == 200 and data == evil.read_bytes()
    finally:
        view.close()
    assert evil.exists() and not os.path.exists(view.path)


def test_bad_input():
    with pytest.raises(FileNotFoundError):
        netron("/nonexistent/model.onnx")
    with pytest.raises(TypeError):
        netron(3.14)


def test_view_main(tmp_path, capsys):
    import onnx
    p = tmp_path / "m.onnx"
    onnx.save(synth.mlp(), p)
    assert view_main([str(p), "--no-browser", "--timeout", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "Serving" in out and "http://127.0.0.1:" in out and "stopped" in out
    assert view_main([str(tmp_path / "missing.onnx"), "--no-browser"]) == 2
    assert threading.active_count() < 50
