"""Every CUDA source string we ship compiles with nvcc (runs without a GPU; skipped without
nvcc). Warnings are errors."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from workbench.arrays.cuda import all_sources
from workbench.arrays.cuda.elementwise import fuse_elementwise

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) is not installed")

CASES = [(name, dt) for dt in ("float32", "float16") for name in all_sources(dt)]


@pytest.mark.parametrize("name,dtype", CASES, ids=[n for n, _ in CASES])
def test_source_compiles_with_nvcc(name, dtype, tmp_path):
    src = all_sources(dtype)[name]
    assert 'extern "C"' in src
    if dtype == "float16":
        assert "#include <cuda_fp16.h>" in src
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run([NVCC, "-ptx", "-x", "cu", "--std=c++14",
                        "-Werror", "all-warnings", "-o", str(tmp_path / "k.ptx"), str(f)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"nvcc failed for {name}:\n{r.stderr}\n--- source ---\n{src}"


def test_fused_chain_source_compiles(tmp_path):
    k = fuse_elementwise([("Add", 1), "Relu", ("LeakyRelu", {"alpha": 0.2}), ("Mul", 2)])
    assert k.n_inputs == 3
    f = tmp_path / "f.cu"
    f.write_text(k.check_source("float16"))
    r = subprocess.run([NVCC, "-ptx", "-x", "cu", "--std=c++14",
                        "-o", str(tmp_path / "f.ptx"), str(f)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
