"""Graph mode (``compile(..., use_graph=True)``) trains with the training-time fusions
(workbench/autodiff/fusion.py's GELU chain, fuse_attention.py's attention core) as eager
training does: the same losses and weights bit for bit, the replayed tape holds the same fused
nodes (and exports the original graph), an eval-mode replay is not fused, a replay whose
kernels are switched off runs unfused as eager does, and a direct ``forward`` replayed in graph
mode gives the same bits at any thread count."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from tests.autograd.test_fuse_attention import (  # noqa: E402
    MASK,
    attention_model,
    check_fused_core_exports_and_refuses_single_node_backward,
)
from tests.autograd.test_fuse_attention import X as AX  # noqa: E402
from tests.autograd.test_fuse_attention import Y as AY  # noqa: E402
from tests.autograd.test_fusion import X as GX  # noqa: E402
from tests.autograd.test_fusion import Y as GY  # noqa: E402
from tests.autograd.test_fusion import gelu_mlp  # noqa: E402
from workbench import autograd, compiled, opt, sonnx, tensor  # noqa: E402
from workbench.autodiff.tape import tape_order  # noqa: E402
from workbench.compiled import image  # noqa: E402


@pytest.fixture(scope="module")
def kernels():
    names = ("transformer.gelu_grad", "attention_avx2.attention_grad")
    if image.supported() is not None \
            or not compiled.wait(["transformer", "attention_avx2"], timeout=900) \
            or any(compiled.kernel(k) is None for k in names):
        pytest.skip(f"kernel modules are not available: {compiled.status()}")


CASES = {"gelu": (gelu_mlp, [GX], GY), "attention": (attention_model, [AX, MASK], AY),
         "causal": (lambda: attention_model("Mul", "where"), [AX], AY)}


def train(case, use_graph, steps=4):
    """(losses, weights, the fused ops of the last step's tape, the model)."""
    build, feeds, y = CASES[case]
    m = sonnx.SONNXModel(build())
    m.compile([tensor.PlaceHolder(a.shape) for a in feeds], is_train=True, use_graph=use_graph)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    losses, fused = [], []
    for _ in range(steps):
        outs = m.forward(*[tensor.from_numpy(a) for a in feeds])
        loss = autograd.softmax_cross_entropy(outs[0], y)
        fused = [n.op_type for n in tape_order([loss]) if n.grad_rule is not None]
        losses.append(loss.item())
        sgd.backward_and_update(loss)
    return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}, fused, m


@pytest.mark.parametrize("case", sorted(CASES))
def test_graph_mode_trains_fused_as_eager_bit_for_bit(kernels, case, monkeypatch):
    eager, graph = train(case, False), train(case, True)
    want = {"gelu": ["Div", "Erf", "Add", "Mul", "Mul"],
            "attention": ["MatMul", "Div", "Add", "Softmax", "MatMul"],
            "causal": ["MatMul", "Mul", "Where", "Softmax", "MatMul"]}[case]
    assert eager[2] == want
    assert graph[2] == want                    # the replays ran fused
    assert [r for r in graph[3]._replays.values() if r]   # (and they were replays)
    assert graph[0] == eager[0]
    for k, w in eager[1].items():
        assert np.array_equal(graph[1][k], w), k
    # fusion off: both unfused, still equal, and the fused run differs only in the last bits
    monkeypatch.setenv("WORKBENCH_FUSE_GELU", "0")
    monkeypatch.setenv("WORKBENCH_FUSE_ATTENTION", "0")
    plain_e, plain_g = train(case, False), train(case, True)
    assert plain_e[2] == plain_g[2] == []
    assert plain_g[0] == plain_e[0]
    np.testing.assert_allclose(graph[0], plain_e[0], rtol=1e-5)


def test_replayed_fused_step_exports_the_graph_and_refuses_single_node_backward(kernels):
    m = sonnx.SONNXModel(attention_model())
    m.compile([tensor.PlaceHolder(AX.shape), tensor.PlaceHolder(MASK.shape)], is_train=True,
              use_graph=True)
    x, mk = tensor.from_numpy(AX), tensor.from_numpy(MASK)
    m.forward(x, mk)                 # recorded (eager)
    check_fused_core_exports_and_refuses_single_node_backward(m, AX)   # replayed, fused


def test_eval_replay_and_replay_without_kernels_run_unfused(kernels):
    outs = {}
    for use_graph in (False, True):
        m = sonnx.SONNXModel(gelu_mlp())
        m.compile([tensor.PlaceHolder(GX.shape)], is_train=True, use_graph=use_graph)
        m.eval()
        got = [m.forward(tensor.from_numpy(GX))[0] for _ in range(3)]
        assert not any(n.grad_rule is not None for n in tape_order([got[-1]]))
        outs[use_graph] = [t.numpy() for t in got]
    for a, b in zip(outs[False], outs[True]):
        assert np.array_equal(a, b)
    # kernels off from the start: eager and graph mode both run the chain's own kernels
    with compiled.disabled():
        eager, graph = train("gelu", False, steps=3), train("gelu", True, steps=3)
    assert eager[2] == graph[2] == []
    assert graph[0] == eager[0]


def test_graph_mode_forward_does_not_depend_on_the_thread_count(monkeypatch):
    """A direct ``forward`` call replayed in graph mode rounds as the eager forward does:
    its products are the same at any engine thread count."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from tests.autograd.test_thread_independent import _model
    from workbench.ops import parallel
    monkeypatch.setattr(parallel, "_PARALLEL_GEMM_MIN", 1 << 16)  # every stack splits too
    rng = np.random.default_rng(4)
    xa = rng.standard_normal((256, 64)).astype(np.float32)
    labels = rng.integers(0, 4, size=256).astype(np.int64)

    def run(threads, use_graph):
        monkeypatch.setenv("WORKBENCH_NUM_THREADS", str(threads))
        x = tensor.from_numpy(xa)
        m = sonnx.SONNXModel(_model())
        m.compile([x], is_train=True, use_graph=use_graph)
        sgd = opt.SGD(lr=0.01, momentum=0.9)
        losses = []
        for _ in range(3):
            loss = autograd.softmax_cross_entropy(m.forward(x)[-1], labels)
            sgd.backward_and_update(loss)
            losses.append(loss.item())
        return losses, {k: v.numpy().copy() for k, v in m.get_params().items()}

    one = run(1, False)
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        two = run(2, True)
    assert two[0] == one[0]
    for k in one[1]:
        assert np.array_equal(two[1][k], one[1][k]), k


def test_a_replay_fuses_only_chains_whose_steps_all_ran_in_training_mode():
    """A replayed tape may mix an imported graph's nodes (recorded in training mode) with
    layers written in Python (recorded out of it), which eager training never fuses."""
    from types import SimpleNamespace

    from workbench.autodiff.runner import _training_chains
    a, b = object(), object()                   # two chains of two steps each
    found = {1: (0, a), 2: (1, a), 3: (0, b), 4: (1, b)}
    calls = {k: SimpleNamespace(training_mode=k != 4) for k in found}
    assert _training_chains(found, calls) == {1: (0, a), 2: (1, a)}
    calls[4].training_mode = True
    assert _training_chains(found, calls) is found
