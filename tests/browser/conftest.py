"""What the real-browser tests share (for this folder, then stopped): one Chromium (through one
Playwright) and one JupyterLab (this tree's front-end, the workbench server extension on),
where each module works in a folder of its own (``tests.helpers.jupyter.LabFolder``). A
JupyterLab start and a browser launch cost seconds each on a busy machine; one per module
cost more than a minute per run. A module that needs another server set-up (the front-end
without the server extension) starts its own."""

from __future__ import annotations

import pytest

from tests.helpers import jupyter


@pytest.fixture(scope="package")
def chromium():
    """The browser tests' Chromium (Playwright's sync API allows one Playwright per thread).
    Package scope, not session: while Playwright's sync API is started, its event loop is the
    running loop of the main thread, and every later test that calls ``asyncio.run`` (the
    server extension's worker pools) would fail; it stops after the last browser test."""
    jupyter.browser_requirements(lab=False)
    from playwright.sync_api import sync_playwright

    jupyter.ROOT.joinpath("test-artifacts").mkdir(exist_ok=True)
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=jupyter.CHROMIUM, headless=True,
                               args=jupyter.CHROME_ARGS)
        yield b
        b.close()
    finally:
        pw.stop()


@pytest.fixture(scope="package")
def shared_lab(tmp_path_factory):
    """The session's JupyterLab (``jupyter.start_test_lab``), serving a folder whose
    subfolders belong to the modules (``jupyter.lab_folder``)."""
    jupyter.browser_requirements(lab=True)
    base = tmp_path_factory.mktemp("sharedlab")
    root = base / "root"
    root.mkdir()
    try:
        srv = jupyter.start_test_lab(base, root)
    except RuntimeError as e:
        pytest.fail(str(e))
    yield srv
    srv.stop()

