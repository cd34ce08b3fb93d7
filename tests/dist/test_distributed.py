"""Data-parallel training with 2 processes on the CPU (opt.DistOpt over MPI).

Each test starts ``mpiexec -n 2 python -m tests.dist.mpi_cases CASE`` itself (so the README's
single pytest command runs them), with one BLAS thread per rank and a wall-clock limit, and
checks the ``RESULT`` line every rank prints. Skipped, with the reason, when mpi4py or mpiexec
is missing (the ``dist`` extra installs both).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.dist import find_mpiexec, mpi4py_available, mpiexec_command, one_thread_env

ROOT = Path(__file__).resolve().parents[2]
N = 2

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(not mpi4py_available(),
                       reason="mpi4py is not installed (pip install 'onnx-workbench[dist]')"),
    pytest.mark.skipif(find_mpiexec() is None,
                       reason="no mpiexec (pip install 'onnx-workbench[dist]': the mpich wheel)"),
]


def mpirun(args, n=N, timeout=240, env_extra=None, mpi_flags=(), cwd=ROOT):
    env = one_thread_env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.update(env_extra or {})
    cmd = mpiexec_command(n) + list(mpi_flags) + [sys.executable, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    p.wall = time.monotonic() - t0
    return p


def results(p, n=N):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    # the ranks share stdout: lines may interleave, the (flat) JSON objects do not nest
    res = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", p.stdout)]
    assert sorted(r["rank"] for r in res) == list(range(n)), out[-4000:]
    assert all(r["world_size"] == n and r["backend"] == "mpi" for r in res)
    return res


def _read_logs(log, want, timeout=5.0):
    """The ranks' stderr files (hydra may exit before forwarding their last lines)."""
    deadline = time.monotonic() + timeout
    while True:
        text = "".join(f.read_text() for f in sorted(log.glob("rank*.err")))
        if want in text or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def case(*args, **kw):
    return results(mpirun(["-m", "tests.dist.mpi_cases", *args], **kw))


@pytest.mark.parametrize("optimizer", ["sgd", "nesterov", "adam", "adamw", "rmsprop",
                                       "adagrad"])
def test_two_processes_equal_one_process_with_the_global_batch(optimizer):
    for r in case("equality", "--opt", optimizer, "--batch", "8", "--steps", "5"):
        assert r["start_equal"] == 0.0          # rank 0's weights were broadcast at compile
        assert r["rel"] <= 1e-6, r              # vs 1 process with batch 2*8
        assert r["ranks"] == 0.0                # the ranks hold identical parameters
        assert r["bytes_per_step"] > 0


def test_fused_and_unfused_all_reduce_agree():
    for r in case("fused", "--steps", "4"):
        assert r["diff_models"] == 0.0, r       # threshold 0 (one by one) vs one buffer
        assert r["diff_api"] == 0.0, r          # all_reduce vs fused_all_reduce
        assert r["diff_half"] == 0.0, r         # the same in float16


def test_float16_wire_within_float16_tolerance():
    for r in case("half", "--steps", "5", "--threshold", "100"):
        # the parameter updates (5 SGD steps) agree with float32 to float16 precision
        assert r["rel_update"] <= 2e-3, r
        assert r["rel"] <= 1e-3, r
        assert r["ranks"] == 0.0


def test_partial_update_equals_serial_simulation():
    for r in case("partial", "--steps", "7", "--threshold", "40"):
        assert r["groups"] > 2                  # several partitions, round robin wraps around
        assert r["rel"] <= 1e-6, r
        assert r["ranks"] > 0                   # by design the ranks differ between cycles


@pytest.mark.parametrize("mode,spars", [("topk", "0.1"), ("thresh", "0.01"),
                                        ("topk_nocorr", "0.2")])
def test_sparse_update_equals_serial_simulation(mode, spars):
    for r in case("sparse", "--mode", mode, "--spars", spars, "--steps", "6",
                  "--threshold", "40"):
        assert r["rel"] <= 1e-6, r
        assert r["ranks"] == 0.0
        assert 0 < r["sent_fraction"] < 1       # really sparse


def test_sonnx_transfer_learning_with_last_layers():
    for r in case("transfer", "--steps", "4"):
        assert r["trained"] == ["head.W", "head.b"]   # the imported layers stayed frozen
        assert r["rel"] <= 1e-6, r
        assert r["ranks"] == 0.0


def test_batchnorm_statistics_and_files_on_rank_0(tmp_path):
    for r in case("bn_checkpoint", "--steps", "3", "--out", str(tmp_path)):
        assert r["params_ranks"] == 0.0         # parameters are synchronised
        assert r["buffers_ranks"] > 0           # BatchNorm statistics are local (as SINGA)
        assert r["buffers_after_sync"] == 0.0   # until sync_buffers averages them
        assert r["sync_err"] <= 1e-6
        assert r["written"] == ["ckpt_rank0.npz", "model_rank0.onnx"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt_rank0.npz", "model_rank0.onnx"]


def test_a_stuck_rank_stops_the_others_with_a_clear_error(tmp_path):
    p = mpirun(["-m", "tests.dist.mpi_cases", "failure", "--mode", "hang", "--timeout", "3",
                "--log", str(tmp_path)], timeout=120)
    assert p.returncode != 0
    assert p.wall < 60, p.wall
    err = _read_logs(tmp_path, "MPI_Abort")
    assert "[rank 0] DistributedError: distributed training stopped at step 3" in err, \
        err[-3000:]
    assert re.search(r"rank 0 waited 3\.\d s \(the timeout\) in all_reduce", err), err[-3000:]


def test_a_killed_rank_stops_the_job():
    # default mpiexec: MPICH's hydra ends the job at once and names the killed process
    p = mpirun(["-m", "tests.dist.mpi_cases", "failure", "--mode", "kill", "--timeout", "60"],
               timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert p.wall < 30, p.wall
    assert "rank 0 step 19 done" not in out
    assert re.search(r"signal 9|Killed|KILLED|killed", out), out[-3000:]


def test_a_killed_rank_is_named_by_the_survivors(tmp_path):
    """With ``mpiexec -disable-auto-cleanup`` hydra signals the survivors (SIGUSR1) instead of
    killing them, and rank 0 stops at once with a DistributedError naming the dead rank (long
    before its 60 s timeout). Hydra still SIGKILLs the survivor in some runs (a race inside
    MPICH's launcher: the job then ends as in the test above), and it may exit before
    forwarding the survivor's output, so rank 0's stderr also goes to a file and the job is
    tried up to 6 times: every run must end within 30 s, and at least one must show the
    message."""
    if "Open MPI" in subprocess.run([find_mpiexec(), "--version"], capture_output=True,
                                    text=True).stdout:
        pytest.skip("-disable-auto-cleanup is an MPICH (hydra) flag")
    seen = []
    for attempt in range(6):
        log = tmp_path / str(attempt)
        log.mkdir()
        p = mpirun(["-m", "tests.dist.mpi_cases", "failure", "--mode", "kill", "--timeout",
                    "60", "--log", str(log)], timeout=120, mpi_flags=["-disable-auto-cleanup"])
        assert p.returncode != 0
        assert p.wall < 30, p.wall
        deadline = time.monotonic() + 5     # the survivor may still be writing
        while "MPI_Abort" not in (err := (log / "rank0.err").read_text()) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        seen.append(p.returncode)
        if "DistributedError" in err:
            assert re.search(r"distributed training stopped at step [23] \(mpi, world size 2\)"
                             r": (rank\(s\) \[1\] of this machine died|the MPI launcher "
                             r"reported that another rank's process failed)", err), err[-3000:]
            return
    # every run ended promptly (asserted above); the message itself lost the race each time
    pytest.skip(f"MPICH's hydra SIGKILLed the surviving rank before it could report in all 6 "
                f"runs (exit codes {seen}); the detection itself is tested in-process by "
                f"tests/dist/test_dist_local.py::test_dead_peer_and_timeout_are_detected")


def test_an_exception_in_one_rank_aborts_all(tmp_path):
    p = mpirun(["-m", "tests.dist.mpi_cases", "failure", "--mode", "raise", "--log",
                str(tmp_path)], timeout=120)
    assert p.returncode != 0
    assert p.wall < 30
    err = _read_logs(tmp_path, "rank failure injected by the test")
    assert "[rank 1] uncaught exception; aborting all 2 ranks (MPI_Abort)" in err, err[-3000:]
    assert "ValueError: rank failure injected by the test" in err
    assert "rank 0 step 19 done" not in p.stdout


@pytest.mark.parametrize("n", [1, N])
def test_singa_test_dist_ported(n):
    """apache/singa test/python/test_dist.py, on CPU processes (world size 1 and 2)."""
    p = mpirun(["-m", "unittest", "-v", "tests.dist.singa_test_dist"], n=n, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert out.count("Ran 6 tests") == n and out.count("\nOK") == n, out[-3000:]


SINGA_CNN = ROOT / "examples" / "singa_cnn"


def _losses(out):
    return [float(v) for v in re.findall(r"Training loss = ([0-9.eE+-]+)", out)]


@pytest.mark.parametrize("option", ["plain", "half", "partialUpdate", "sparseTopK",
                                    "sparseThreshold"])
def test_singa_cnn_example_trains(option):
    """SINGA's examples/cnn program (train_mpi.py + train_cnn.py), imports changed, on
    MNIST-shaped synthetic data: the training loss goes down."""
    p = mpirun([str(SINGA_CNN / "train_mpi.py"), "cnn", "mnist", "-m", "3", "-b", "32",
                "-d", option, "-s", "0.05"], timeout=300, cwd=SINGA_CNN,
               env_extra={"SYNTHETIC_MNIST_TRAIN": "512", "SYNTHETIC_MNIST_VAL": "128"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    losses = _losses(p.stdout)
    assert len(losses) == 3, out[-3000:]       # printed by rank 0 only
    assert losses[-1] < losses[0], losses
    assert "Evaluation accuracy" in p.stdout


def test_singa_multiprocess_example_needs_a_gpu():
    """train_multiprocess.py shares a NCCL id made in the parent: without cupy it stops with
    the clear error (there is no GPU here; on GPUs it trains like train_mpi.py)."""
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed: the GPU tests cover the multiprocess example")
    except ImportError:
        pass
    p = subprocess.run([sys.executable, str(SINGA_CNN / "train_multiprocess.py"), "cnn",
                        "mnist", "-m", "1", "-w", "2"], capture_output=True, text=True,
                       timeout=120, cwd=SINGA_CNN,
                       env={**one_thread_env(), "PYTHONPATH": str(ROOT)})
    assert p.returncode != 0
    assert "NcclIdHolder needs cupy" in p.stderr and "mpiexec -n N" in p.stderr
