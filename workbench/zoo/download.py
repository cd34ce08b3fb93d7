"""Downloads into the workbench cache: progress, resume, sha256, atomic placement, offline mode.

The cache folder is ``$WORKBENCH_HOME`` (default: ``$XDG_CACHE_HOME/onnx-workbench`` or
``~/.cache/onnx-workbench``). A download goes to ``NAME.part`` beside its final place, resumes
from there with an HTTP Range request, is verified (size and sha256) and only then renamed into
place. Set ``WORKBENCH_OFFLINE=1`` (or pass ``offline=True``) to never touch the network: a file
that is not cached then gives an error naming the file to place by hand and where.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.request

from workbench.errors import ChecksumError, DownloadError
from workbench.files import cache_home

CHUNK = 1 << 16


def cache_dir() -> str:
    """The workbench cache folder (created on demand): :func:`workbench.files.cache_home`."""
    return cache_home()


def is_offline() -> bool:
    return os.environ.get("WORKBENCH_OFFLINE", "").strip().lower() in ("1", "true", "yes")


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Progress:
    """A small progress bar: text on stderr (a notebook shows the same lines)."""

    def __init__(self, name: str, total: int | None, enabled: bool = True, start: int = 0):
        self.name, self.total, self.enabled = name, total, enabled
        self.done = start
        self.t0 = time.monotonic()
        self.last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self.last > 0.5):
            self.last = now
            self._draw(now)

    def _draw(self, now: float, end: str = "\r") -> None:
        rate = self.done / max(now - self.t0, 1e-6)
        if self.total:
            frac = min(1.0, self.done / self.total)
            bar = "#" * int(frac * 30)
            eta = (self.total - self.done) / max(rate, 1e-6)
            msg = (f"{self.name}: [{bar:30s}] {frac * 100:5.1f}% {self.done / 1e6:.1f}/"
                   f"{self.total / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s, ETA {eta:.0f}s")
        else:
            msg = f"{self.name}: {self.done / 1e6:.1f} MB, {rate / 1e6:.1f} MB/s"
        print(msg, end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic(), end="\n")


def _hint(name: str, dest: str, url: str, sha256: str | None) -> str:
    h = f" (sha256 {sha256})" if sha256 else ""
    return (f"place the file {name!r}{h} at {dest!r} by hand (download it from {url} on a "
            f"machine with network access)")


def download(url: str, dest: str, *, sha256: str | None = None, size: int | None = None,
             offline: bool | None = None, progress: bool = True, timeout: float = 60,
             retries: int = 2) -> str:
    """Download ``url`` to ``dest`` unless a verified copy is already there; returns ``dest``.

    A cached file whose sha256 does not match (a corrupt cache entry) is downloaded again; the
    bad copy is kept beside it as ``dest + '.corrupt'`` rather than silently deleted.
    """
    name = os.path.basename(dest)
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(dest):
        if sha256 is None or sha256_of(dest) == sha256:
            return dest
        os.replace(dest, dest + ".corrupt")
        print(f"{name}: the cached copy does not match its sha256; downloading it again "
              f"(the bad copy is kept as {dest}.corrupt)", file=sys.stderr)
    if offline is None:
        offline = is_offline()
    if offline:
        raise DownloadError(f"{name} is not in the cache and the workbench is offline "
                            f"(WORKBENCH_OFFLINE=1): " + _hint(name, dest, url, sha256))
    part = dest + ".part"
    last_error: Exception | None = None
    for attempt in range(retries + 1):
        try:
            _fetch(url, part, name, size, progress, timeout)
            break
        except DownloadError as e:
            last_error = e
            if getattr(e, "permanent", False) or attempt == retries:
                raise
            time.sleep(0.2 * (attempt + 1))
    else:  # pragma: no cover
        raise last_error  # type: ignore[misc]
    got_size = os.path.getsize(part)
    if size is not None and got_size != size:
        if got_size > size:
            os.remove(part)
        raise DownloadError(f"{name}: got {got_size:,} bytes from {url}, expected {size:,}; "
                            f"run again to resume, or " + _hint(name, dest, url, sha256))
    if sha256 is not None:
        got = sha256_of(part)
        if got != sha256:
            os.remove(part)
            raise ChecksumError(f"{name}: sha256 mismatch for {url}: expected {sha256}, got "
                                f"{got}; the download was discarded. The server may serve a "
                                f"different file; " + _hint(name, dest, url, sha256))
    os.replace(part, dest)
    return dest


def _fetch(url: str, part: str, name: str, size: int | None, progress: bool,
           timeout: float) -> None:
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if size is not None and have >= size:
        return
    req = urllib.request.Request(url, headers={"User-Agent": "onnx-workbench"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - http(s) only
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # range not satisfiable: the part is complete or bad
            return
        err = DownloadError(f"{name}: the server answered HTTP {e.code} {e.reason} for {url}")
        err.permanent = e.code in (401, 403, 404, 410)
        raise err from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DownloadError(f"{name}: cannot reach {url} ({reason}); check the network or set "
                            f"WORKBENCH_OFFLINE=1 and place the file by hand") from None
    with resp:
        status = getattr(resp, "status", 200)
        mode = "ab" if (have and status == 206) else "wb"
        if mode == "wb":
            have = 0
        length = resp.headers.get("Content-Length")
        total = (have + int(length)) if length else size
        bar = _Progress(name, total, progress, start=have)
        try:
            with open(part, mode) as f:
                while True:
                    try:
                        block = resp.read(CHUNK)
                    except (OSError, ValueError, http.client.HTTPException) as e:
                        raise DownloadError(f"{name}: the connection broke after "
                                            f"{bar.done:,} bytes ({e}); run again to resume"
                                            ) from None
                    if not block:
                        break
                    f.write(block)
                    bar.update(len(block))
        finally:
            bar.close()
        if length and bar.done < total:
            raise DownloadError(f"{name}: the server closed the connection after {bar.done:,} of "
                                f"{total:,} bytes; run again to resume")
