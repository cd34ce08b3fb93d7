"""Downloads against a local HTTP server on 127.0.0.1 serving real ONNX files.

Cases: good, resumed partial download, corrupt cache entry, truncated transfer, wrong checksum,
server error, offline mode.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading

import pytest

from workbench.cli import default_model_path
from workbench.errors import ChecksumError, DownloadError
from workbench.zoo.download import download, sha256_of

REAL = open(default_model_path(), "rb").read()
SHA = hashlib.sha256(REAL).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    hits: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        Handler.hits.append((self.path, self.headers.get("Range")))
        if self.path == "/error":
            self.send_error(500, "boom")
            return
        if self.path == "/missing":
            self.send_error(404, "nope")
            return
        body = REAL
        if self.path == "/corrupt":
            body = REAL[:100] + b"\x00" * (len(REAL) - 100)
        start = 0
        rng = self.headers.get("Range")
        if rng and self.path in ("/good", "/corrupt"):
            start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        if self.path == "/truncated":
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        self.wfile.write(body[start:])


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_good_download_is_verified_and_cached(server, tmp_path):
    dest = str(tmp_path / "m.onnx")
    assert download(server + "/good", dest, sha256=SHA, size=len(REAL), progress=False) == dest
    assert sha256_of(dest) == SHA
    assert not os.path.exists(dest + ".part")
    import onnx
    onnx.checker.check_model(onnx.load(dest))
    n = len(Handler.hits)
    download(server + "/good", dest, sha256=SHA, progress=False)  # cached: no request
    assert len(Handler.hits) == n


def test_resume_partial(server, tmp_path):
    dest = str(tmp_path / "m.onnx")
    with open(dest + ".part", "wb") as f:
        f.write(REAL[:1000])
    Handler.hits.clear()
    download(server + "/good", dest, sha256=SHA, size=len(REAL), progress=False)
    assert Handler.hits[-1] == ("/good", "bytes=1000-")
    assert sha256_of(dest) == SHA


def test_corrupt_cache_entry_redownloaded_and_kept_aside(server, tmp_path):
    dest = str(tmp_path / "m.onnx")
    with open(dest, "wb") as f:
        f.write(b"junk")
    download(server + "/good", dest, sha256=SHA, progress=False)
    assert sha256_of(dest) == SHA
    assert open(dest + ".corrupt", "rb").read() == b"junk"   # the user's bytes are not lost


def test_wrong_checksum(server, tmp_path):
    dest = str(tmp_path / "m.onnx")
    with pytest.raises(ChecksumError, match="sha256 mismatch") as e:
        download(server + "/corrupt", dest, sha256=SHA, size=len(REAL), progress=False)
    assert SHA in str(e.value) and "m.onnx" in str(e.value)
    assert not os.path.exists(dest) and not os.path.exists(dest + ".part")


def test_truncated_transfer_then_resume(server, tmp_path):
    dest = str(tmp_path / "m.onnx")
    with pytest.raises(DownloadError, match="resume"):
        download(server + "/truncated", dest, sha256=SHA, size=len(REAL), progress=False,
                 retries=0)
    assert not os.path.exists(dest)
    assert os.path.getsize(dest + ".part") == len(REAL) // 3
    download(server + "/good", dest, sha256=SHA, size=len(REAL), progress=False)
    assert sha256_of(dest) == SHA


def test_server_error(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 500"):
        download(server + "/error", str(tmp_path / "m.onnx"), sha256=SHA, progress=False,
                 retries=1)
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(server + "/missing", str(tmp_path / "m.onnx"), progress=False)


def test_unreachable_server(tmp_path):
    with pytest.raises(DownloadError, match="cannot reach"):
        download("http://127.0.0.1:9/x.onnx", str(tmp_path / "m.onnx"), progress=False,
                 retries=0, timeout=2)


def test_offline_mode_names_file_to_place(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_OFFLINE", "1")
    dest = str(tmp_path / "resnet18-v1-7.onnx")
    with pytest.raises(DownloadError) as e:
        download("http://127.0.0.1:9/x.onnx", dest, sha256=SHA)
    msg = str(e.value)
    assert "offline" in msg and "resnet18-v1-7.onnx" in msg and dest in msg and SHA in msg


def test_registry_and_suggestions():
    from workbench import zoo
    from workbench.errors import WorkbenchError
    assert len(zoo.names()) == 10
    assert zoo.get("ResNet18").file_name == "resnet18-v1-7.onnx"
    assert zoo.get("tiny_yolov2").name == "tinyyolov2"
    with pytest.raises(WorkbenchError, match="did you mean 'resnet18'"):
        zoo.get("resnt18")


def test_fetch_uses_cache_dir(tmp_path, monkeypatch):
    from workbench import zoo
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    monkeypatch.setenv("WORKBENCH_OFFLINE", "1")
    assert zoo.path("resnet18").startswith(str(tmp_path))
    with pytest.raises(DownloadError, match="resnet18-v1-7.onnx"):
        zoo.fetch("resnet18")
