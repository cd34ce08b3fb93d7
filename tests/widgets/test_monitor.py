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
        assert notebook == [mon.widget]
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
