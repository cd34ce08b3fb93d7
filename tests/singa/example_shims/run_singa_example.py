"""Run one of SINGA's ``examples/onnx`` programs (ported under ``examples/singa_onnx``, only its
imports changed) offline: ``python run_singa_example.py PROGRAM.py [ARGS...]``.

Used by tests/singa/test_examples_onnx.py in a fresh process. The zoo files the program would
download are already where its download helper (``utils.check_exist_or_download``) looks, as
architecture twins; this runner only adapts the environment, never the program:

- ``urllib.request.urlretrieve`` fails with a clear message (no network: a file the test did not
  provide is an error, not a download);
- ``PIL.Image.ANTIALIAS`` (removed in Pillow 10; ``fer_emotion.py`` uses it) is Pillow's
  ``LANCZOS``, the filter it was an alias of;
- the folder holding this runner (stand-ins for ``transformers`` and SINGA's ``data``
  package) and the program's own folder are put on ``sys.path``;
- ``WORKBENCH_LAST_LAYERS=singa``: SINGA's programs count ``last_layers`` as SINGA's code
  does (see ``workbench.sonnx``).
"""

from __future__ import annotations

import os
import runpy
import sys


def _offline(url, *args, **kwargs):
    raise OSError(f"offline test run: the program asked to download {url}, which the test "
                  f"did not provide")


def main(argv: list) -> None:
    if not argv:
        raise SystemExit("usage: run_singa_example.py PROGRAM.py [ARGS...]")
    program = os.path.abspath(argv[0])
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.dirname(program), here]
    os.environ.setdefault("WORKBENCH_LAST_LAYERS", "singa")

    import urllib.request
    urllib.request.urlretrieve = _offline

    from PIL import Image
    if not hasattr(Image, "ANTIALIAS"):
        Image.ANTIALIAS = Image.LANCZOS

    sys.argv = [program] + list(argv[1:])
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
