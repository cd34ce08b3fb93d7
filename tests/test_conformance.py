"""The ONNX conformance yardstick: every official node test case of the installed onnx package.

Each case either passes or is listed in ``tests/conformance_expected_failures.txt`` with its
reason (strict: a listed case that starts passing must be removed from the file). The bar of
the issue (>= 1,400 of onnx 1.23.2's 1,884 cases) is checked from that file, and every
single-node case of SINGA's 77 supported operators must pass.
"""

from __future__ import annotations

import os

import pytest

from workbench import conformance

pytestmark = pytest.mark.conformance

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = conformance.load_expected_failures(
    os.path.join(HERE, "conformance_expected_failures.txt"))
#: cases that fail on CUDA only (on top of EXPECTED), with the reason
EXPECTED_CUDA = conformance.load_expected_failures(
    os.path.join(HERE, "conformance_expected_failures_cuda.txt"))
CASES = conformance.collect()

#: cases whose expected outputs are random draws: listed as expected failures, but a draw
#: that happens to match (small inputs, extreme probabilities) is not an error
RANDOM_CASES = ("test_bernoulli",)

SINGA_OPS = """Acos Acosh Add And Asin Asinh Atan Atanh AveragePool BatchNormalization Cast Ceil
Clip Concat ConstantOfShape Conv Cos Cosh Div Dropout Elu Equal Erf Expand Flatten Gather Gemm
GlobalAveragePool Greater HardSigmoid Identity LeakyRelu Less Log MatMul Max MaxPool Mean Min Mul
Neg NonZero Not OneHot Or Pad Pow PRelu Reciprocal ReduceMean ReduceSum Relu Reshape
ScatterElements Selu Shape Sigmoid Sign Sin Sinh Slice Softmax Softplus Softsign Split Sqrt
Squeeze Sub Sum Tan Tanh Tile Transpose Unsqueeze Upsample Where Xor""".split()


def test_singa_list_is_complete():
    assert len(SINGA_OPS) == 77


def test_bar_of_the_issue():
    total = len(CASES)
    failing = sum(1 for c in CASES if c.name in EXPECTED)
    passing = total - failing
    print(f"conformance: {passing}/{total} expected to pass")
    assert passing >= 1400, f"only {passing}/{total} conformance cases pass"


def test_expected_failures_file_is_clean():
    names = {c.name for c in CASES}
    stale = sorted(set(EXPECTED) - names)
    assert not stale, f"expected-failures entries that are not onnx cases: {stale[:10]}"
    assert all(EXPECTED.values()), "every expected failure needs a reason"
    stale = sorted(set(EXPECTED_CUDA) - names)
    assert not stale, f"CUDA expected-failures entries that are not onnx cases: {stale[:10]}"
    assert all(EXPECTED_CUDA.values()), "every expected failure needs a reason"


def test_singa_single_node_cases_are_not_excused():
    excused = []
    for c in CASES:
        ops = {n.op_type for n in c.model.graph.node}
        if len(ops) == 1 and ops <= set(SINGA_OPS) and c.name in EXPECTED:
            excused.append(c.name)
    assert not excused, f"single-node cases of SINGA's operators must pass: {excused}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case, device):
    """Every case on the CPU, and on CUDA:0 where a GPU is present (``device`` fixture)."""
    dev = str(device)
    r = conformance.run_case(case, dev)
    expected = dict(EXPECTED)
    file = "conformance_expected_failures.txt"
    if dev != "CPU" and case.name in EXPECTED_CUDA:
        expected[case.name] = EXPECTED_CUDA[case.name]
        file = "conformance_expected_failures_cuda.txt"
    if case.name in expected:
        if r.ok:
            if case.name.startswith(RANDOM_CASES):
                return  # a random draw happened to equal the expected one: nothing to fix
            pytest.fail(f"{case.name} now passes on {dev}: remove it from {file} "
                        f"(listed reason: {expected[case.name]})")
        pytest.xfail(expected[case.name])
    assert r.ok, f"{dev}: {r.message}"
