import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from workbench.widgets import TrainingMonitor
from workbench.widgets import monitor as monitor_mod


def _train(mon, steps=30, stop_at=None, val_every=10):
    done = 0
    for i in range(steps):
        mon.update(loss=1.0 / (i + 1), metrics={"acc": i / steps})
        done += 1
        if (i + 1) % val_every == 0:
            mon.update(loss=1.5 / (i + 1), metrics={"acc": i / (steps + 5)}, phase="val")
        if stop_at is not None and i + 1 == stop_at:
            mon.stop()
        if mon.should_stop:
            break
    return done


def test_plain_script_writes_a_text_bar_to_stderr():
    code = textwrap.dedent("""
        from workbench.widgets import TrainingMonitor
        with TrainingMonitor(total=50, title="fit") as mon:
            for i in range(50):
                mon.update(loss=1 / (i + 1), metrics={"acc": i / 50})
                if i % 10 == 9:
                    mon.update(loss=2 / (i + 1), phase="val")
        print("ok", mon.step)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok 50"
    assert "fit: [" in r.stderr and "100.0% 50/50" in r.stderr
    assert "fit: 50 step(s)" in r.stderr and "best val loss" in r.stderr


def test_text_mode_history_stop_and_summary():
    out = io.StringIO()
    mon = TrainingMonitor(total=30, display="text", stream=out)
    assert mon.mode == "text"
    with mon:
        n = _train(mon, stop_at=12)
    assert n == 12 and mon.should_stop and mon.finished
    assert mon.history["train"]["step"] == list(range(1, 13))
    assert mon.history["val"]["step"] == [10]
    assert mon.history["train"]["acc"][0] == 0.0
    text = out.getvalue()
    assert "12 step(s)" in text and "stopped" in text
    assert "done" in repr(mon)


def test_tty_stream_redraws_one_line():
    class TTY(io.StringIO):
        def isatty(self):
            return True
    out = TTY()
    with TrainingMonitor(total=5, display="text", stream=out) as mon:
        _train(mon, steps=5, val_every=5)
    assert out.getvalue().count("\r") >= 2


def test_closed_stream_and_no_display_never_raise():
    out = io.StringIO()
    out.close()
    with TrainingMonitor(total=5, display="text", stream=out) as mon:
        _train(mon, steps=5)
    with TrainingMonitor(display=False) as mon:
        _train(mon, steps=5)
    assert mon.step == 5 and mon.eta is None
    with pytest.raises(ValueError):
        mon.update(loss=1, phase="test")


@pytest.fixture
def notebook(monkeypatch):
    shown = []
    monkeypatch.setattr(monitor_mod, "in_notebook", lambda: True)
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: shown.extend(a))
    return shown


def test_widget_mode_updates_traits_and_stop_button(notebook, monkeypatch):
    monkeypatch.setattr(monitor_mod, "PUSH_INTERVAL", 0.0)
    mon = TrainingMonitor(total=40, title="nb")
    assert mon.mode == "widget" and mon.widget is not None
    with mon:
        assert notebook == [mon]             # shown through its mime bundle (widget view)
        for i in range(40):
            mon.update(loss=1 / (i + 1), metrics={"acc": i / 40})
            if i == 9:
                mon.update(loss=0.5, phase="val")
            if i == 14:
                mon.widget.set_state({"stop_requested": True})   # the Stop button
            if mon.should_stop:
                break
    w = mon.widget
    assert mon.step == 15 and w.step == 15 and w.total == 40
    assert w.series["loss"]["train"][-1] == [15, pytest.approx(1 / 15)]
    assert w.series["loss"]["val"] == [[10, 0.5]]
    assert w.latest["train"]["acc"] == pytest.approx(14 / 40)
    assert w.done and "15 step(s)" in w.summary and "stop requested" in w.summary


def test_series_are_thinned_for_the_browser(notebook, monkeypatch):
    monkeypatch.setattr(monitor_mod, "PUSH_INTERVAL", 0.0)
    with TrainingMonitor(total=5000) as mon:
        for i in range(5000):
            mon.update(loss=float(i))
    pts = mon.widget.series["loss"]["train"]
    assert len(pts) <= monitor_mod.MAX_POINTS + 1 and pts[-1] == [5000, 4999.0]
    assert len(mon.history["train"]["loss"]) == 5000


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_first_interrupt_is_a_stop_request_second_one_interrupts(notebook):
    before = signal.getsignal(signal.SIGINT)
    mon = TrainingMonitor(total=10)
    with mon:
        assert mon.widget.sigint_armed
        os.kill(os.getpid(), signal.SIGINT)          # what the Stop button asks the server
        mon.update(loss=1.0)
        assert mon.should_stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            mon.update(loss=1.0)
    assert signal.getsignal(signal.SIGINT) == before
    assert not mon.widget.sigint_armed


def test_fit_callback_and_tensor_values():
    np = pytest.importorskip("numpy")
    mon = TrainingMonitor(total=3, display=False)
    with mon:
        assert mon.fit_callback(0, {"loss": np.float32(0.5), "accuracy": 0.7, "val_loss": 0.6,
                                    "val_accuracy": 0.65, "time": 1.0}) is True
        mon.update(loss=np.array([0.25]))            # a 1-element array
        mon.stop()
        assert mon.fit_callback(1, {"loss": 0.4}) is False
    assert mon.history["train"]["loss"] == [0.5, 0.25, 0.4]
    assert mon.history["val"]["accuracy"] == [0.65]
    assert "time" not in mon.history["train"]


def _svg_panels(svg: str) -> dict:
    import xml.etree.ElementTree as ET
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(svg)
    panels = {}
    for g in root.findall("s:g", ns):
        texts = {t.get("class"): "".join(t.itertext()) for t in g.findall("s:text", ns)
                 if t.get("class")}
        path = g.find("s:path[@class='train']", ns)
        panels[g.get("data-metric")] = {
            "x": texts.get("x-title"), "y": texts.get("y-title"),
            "train_points": path.get("d").count("L") + 1 if path is not None else 0,
            "val_points": len(g.findall("s:circle[@class='val']", ns)),
            "ticks": [t.text for t in g.findall("s:text", ns) if not t.get("class")
                      and t.get("fill") == "#52606d"]}
    return root, panels


def test_curves_svg_has_titled_axes_ticks_and_both_phases():
    mon = TrainingMonitor(total=30, display=False, title="fit <digits>")
    with mon:
        _train(mon, steps=30)
    root, panels = _svg_panels(mon.curves_svg())
    assert set(panels) == {"loss", "acc"}
    for name, p in panels.items():
        assert p["x"] == "step (batches)" and p["y"] == name
        assert p["train_points"] == 30 and p["val_points"] == 3
        assert len(p["ticks"]) >= 4          # values on y, steps on x
    assert "fit &lt;digits&gt;" in mon.curves_svg()          # escaped
    text = "".join(root.itertext())
    assert "final train: loss 0.0333" in text and "best val loss" in text
    empty = monitor_mod.curves_svg({}, "nothing yet")
    assert "no values recorded" in empty


def test_non_finite_values_are_left_out_of_the_picture():
    svg = monitor_mod.curves_svg({"loss": {"train": [[1, 1.0], [2, float("nan")], [3, 0.5]],
                                           "val": [[3, float("inf")]]}})
    _, panels = _svg_panels(svg)
    assert panels["loss"]["train_points"] == 2 and panels["loss"]["val_points"] == 0
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    for pts in ([[1, -1e308], [2, 1e308]], [[1, 1e-320], [2, 0.0]], [[5, 2.0]]):
        svg = monitor_mod.curves_svg({"loss": {"train": pts}})     # extreme ranges
        assert "nan" not in svg.lower() and "inf" not in svg.lower(), pts
        assert _svg_panels(svg)[1]["loss"]["train_points"] == len(pts)


def test_widget_output_gets_the_static_curves_when_training_ends(monkeypatch):
    """In a notebook the monitor is displayed with a display id; close() updates that output
    with the widget view, the summary as text and the curves as SVG, so a saved notebook
    shows the curves where widgets do not render."""
    monkeypatch.setattr(monitor_mod, "in_notebook", lambda: True)
    monkeypatch.setattr(monitor_mod, "PUSH_INTERVAL", 0.0)
    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj._repr_mimebundle_())

    def display(obj, display_id=None):
        shown.append(obj._repr_mimebundle_())
        return Handle() if display_id else None

    import IPython.display
    monkeypatch.setattr(IPython.display, "display", display)
    mon = TrainingMonitor(total=20, title="nb")
    with mon:
        _train(mon, steps=20)
    (start,) = shown
    assert "application/vnd.jupyter.widget-view+json" in start
    assert start["text/plain"] == "TrainingMonitor('nb', running, step 0/20, widget)"
    assert "image/svg+xml" not in start          # nothing recorded yet
    assert len(updates) == 1
    final = updates[0]
    assert final["application/vnd.jupyter.widget-view+json"]["model_id"] == mon.widget.model_id
    assert final["text/plain"].startswith("nb: 20 step(s)")
    _, panels = _svg_panels(final["image/svg+xml"])
    assert panels["loss"]["train_points"] == 20


def test_saved_notebook_output_holds_the_curves(tmp_path):
    """A real kernel: the committed output of a training cell carries the widget view, the
    summary and the SVG of the curves (what GitHub or nbviewer show)."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat

    from tests.helpers.kernel import run_notebook
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from workbench.widgets import TrainingMonitor\n"
        "with TrainingMonitor(total=12, title='run') as mon:\n"
        "    for i in range(12):\n"
        "        mon.update(loss=1 / (i + 1), metrics={'acc': i / 12})\n"
        "    mon.update(loss=0.2, phase='val')\n")]
    run_notebook(nb, tmp_path)
    outs = nb.cells[0].outputs
    assert len(outs) == 1 and outs[0].output_type == "display_data", outs
    data = outs[0].data
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"].startswith("run: 12 step(s)")
    _, panels = _svg_panels(data["image/svg+xml"])
    assert panels["loss"]["train_points"] == 12 and panels["loss"]["val_points"] == 1


def test_display_without_display_ids_still_shows_the_widget(monkeypatch):
    """Where the display hook knows no display ids (some remote engines), the monitor is
    shown without one (no final picture) and stays a widget."""
    monkeypatch.setattr(monitor_mod, "in_notebook", lambda: True)
    shown = []

    def display(obj, **kw):
        if "display_id" in kw:
            raise TypeError("display_id not supported here")
        shown.append(obj)

    import IPython.display
    monkeypatch.setattr(IPython.display, "display", display)
    with TrainingMonitor(total=5) as mon:
        _train(mon, steps=5)
    assert shown == [mon] and mon.mode == "widget" and mon.widget.done
