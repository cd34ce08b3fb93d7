"""Netron, the model viewer, served by its own Python package on 127.0.0.1.

>>> view = netron("model.onnx")     # doctest: +SKIP
>>> view                            # an IFrame showing Netron in the notebook
>>> view.close()                    # stops the server (also on garbage collection and at exit)

``view_main(argv)`` is the ``workbench view MODEL`` command: it serves the model, prints the
address, opens a browser unless ``--no-browser``, and stops the server on Ctrl-C (or after
``--timeout`` seconds).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import weakref

try:
    from IPython.display import IFrame as _IFrame
except ImportError:  # pragma: no cover - IPython is a dependency of the widgets
    class _IFrame:  # minimal stand-in
        def __init__(self, src, width, height, **kwargs):
            self.src, self.width, self.height = src, width, height

        def _repr_html_(self):
            from workbench.widgets._html import tag
            return tag("iframe", width=self.width, height=self.height, src=self.src,
                       frameborder="0", allowfullscreen="")

_LIVE: weakref.WeakSet[NetronView] = weakref.WeakSet()
_LOCK = threading.Lock()


def _import_netron():
    try:
        import netron as _netron
    except ImportError as e:
        raise ImportError("the Netron viewer needs the `netron` package: pip install netron") \
            from e
    return _netron


def _quiet_call(fn, *args, **kwargs):
    """Call a netron function without it configuring the root logger or printing."""
    root = logging.getLogger()
    handler = logging.NullHandler()
    with _LOCK:
        added = not root.hasHandlers()
        if added:
            root.addHandler(handler)
        try:
            return fn(*args, **kwargs)
        finally:
            if added:
                root.removeHandler(handler)


#: a file name Netron's server may show and serve as it is (ASCII letters, digits, . _ -)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,80}\.onnx")


def _safe_name(text: str) -> str:
    """Letters, digits, '.', '_' and '-' of ``text`` (at most 60), or "model"."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text or "model").strip("._")[:60] or "model"


def _model_file(model) -> tuple[str, str | None]:
    """(path to serve, temp folder to delete afterwards or None)."""
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such model file")
        path = os.path.abspath(path)
        base = os.path.basename(path)
        if _SAFE_NAME.fullmatch(base) and not set(path) & set("<>\"'&"):
            return path, None
        # Netron's server writes the file's name and path unescaped into its page (<meta>
        # tags) and the name into the model's URL: markup or quotes there would become HTML
        # in Netron's frame (and the model would not load). Serve it under a plain name: a
        # hard link to the file (a copy across file systems; Netron's server refuses a
        # symbolic link that leads out of the served folder) in a folder of our own.
        folder = tempfile.mkdtemp(prefix="workbench-netron-")
        safe = os.path.join(folder, _safe_name(base[:-5] if base.endswith(".onnx") else base)
                            + ".onnx")
        try:
            os.link(path, safe)
        except OSError:
            shutil.copyfile(path, safe)
        return safe, folder
    proto = None
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray)):
        proto = onnx.ModelProto()
        proto.ParseFromString(bytes(model))
    else:
        p = getattr(model, "proto", None)
        p = p() if callable(p) else p
        if isinstance(p, onnx.ModelProto):
            proto = p
        elif getattr(model, "path", None):
            return _model_file(model.path)
        elif hasattr(model, "to_proto"):
            proto = model.to_proto()
    if proto is None:
        raise TypeError(f"cannot show a {type(model).__name__} in Netron: give a path, an "
                        f"onnx.ModelProto, or a workbench model")
    folder = tempfile.mkdtemp(prefix="workbench-netron-")
    # the graph name is the model's text: only letters, digits, '.', '_' and '-' of it make
    # the file name (Netron shows it, and it must stay inside the folder)
    path = os.path.join(folder, f"{_safe_name(proto.graph.name)}.onnx")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path, folder


class NetronView(_IFrame):
    """An IFrame on a running Netron server; ``close()`` stops the server."""

    def __init__(self, address, path: str, tmpdir: str | None, width="100%", height=600):
        self.address = tuple(address)
        self.url = f"http://{address[0]}:{address[1]}/"
        self.path = path
        self._tmpdir = tmpdir
        self.closed = False
        super().__init__(self.url, width=width, height=height)
        _LIVE.add(self)

    def close(self) -> None:
        """Stop this view's server and remove its temporary model file."""
        if self.closed:
            return
        self.closed = True
        try:
            nt = _import_netron()
            _quiet_call(nt.stop, self.address)
            # netron's server thread notices the stop within its 0.25 s poll: wait for it, so
            # that "closed" means the port is free again
            deadline = time.monotonic() + 2.0
            while nt.status(self.address) and time.monotonic() < deadline:
                time.sleep(0.02)
        except Exception:
            pass
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    stop = close

    @property
    def running(self) -> bool:
        if self.closed:
            return False
        try:
            return bool(_import_netron().status(self.address))
        except Exception:
            return False

    def __enter__(self) -> NetronView:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "stopped" if self.closed else "serving"
        return f"NetronView({os.path.basename(self.path)!r} {state} at {self.url})"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))

    def _repr_html_(self):
        from workbench.widgets._html import tag
        if self.closed:
            return tag("p", f"Netron view of {os.path.basename(self.path)} was closed.")
        # IPython's IFrame writes its src and sizes unescaped; ours are our own URL and the
        # caller's sizes, escaped all the same
        return tag("iframe", width=self.width, height=self.height, src=self.src,
                   frameborder="0", allowfullscreen="")

    def _repr_mimebundle_(self, **kwargs):
        from workbench.widgets._base import in_notebook
        if in_notebook() and not self.closed:
            return {"text/html": self._repr_html_(), "text/plain": repr(self)}
        return {"text/plain": repr(self)}


def netron(model, *, port: int = 0, host: str = "127.0.0.1", width="100%",
           height: int = 600) -> NetronView:
    """Serve ``model`` (path, ModelProto, bytes, LoadedModel/Model) with Netron's own server
    on ``host`` (127.0.0.1) and a free port; returns an IFrame handle (``close()`` stops it)."""
    nt = _import_netron()
    path, tmpdir = _model_file(model)
    try:
        address = _quiet_call(nt.start, path, address=(host, int(port)), browse=False)
    except Exception:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    return NetronView(address, path, tmpdir, width=width, height=height)


@atexit.register
def stop_all() -> None:
    """Stop every Netron server started through :func:`netron` that is still running."""
    for view in list(_LIVE):
        view.close()


def view_main(argv=None) -> int:
    """``workbench view MODEL``: serve a model in Netron until Ctrl-C. Returns an exit code."""
    ap = argparse.ArgumentParser(prog="workbench view",
                                 description="Show an ONNX model in Netron (served locally).")
    ap.add_argument("model", help="path to an .onnx file")
    ap.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop after this many seconds (default: run until Ctrl-C)")
    args = ap.parse_args(argv)
    try:
        _import_netron()
    except ImportError as e:
        print(f"workbench view: {e}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.model):
        print(f"workbench view: {args.model}: no such file", file=sys.stderr)
        return 2
    try:
        view = netron(args.model, port=args.port, host=args.host)
    except OSError as e:
        print(f"workbench view: could not start the server on {args.host}:{args.port}: {e}",
              file=sys.stderr)
        return 1
    print(f"Serving {args.model} at {view.url} (Ctrl-C to stop)", flush=True)
    if not args.no_browser:
        import webbrowser
        webbrowser.open(view.url)
    try:
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while view.running and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
    print("stopped", flush=True)
    return 0
