"""Sequence and optional kernels against numpy expectations."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.arrays import cupy_module
from workbench.errors import InputError, ShapeError
from workbench.ops import sequence_repr
from workbench.ops.registry import NodeContext, attribute_defaults, lookup
from workbench.ops.sequence import NONE_OPTIONAL


def run(op, *inputs, opset=21, n_outputs=1, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs)
    return entry.fn(*inputs, **kw)


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.ones((1, 3), np.float32)


def test_none_optional_is_the_shared_sentinel():
    assert NONE_OPTIONAL is sequence_repr.NONE_OPTIONAL
    assert not NONE_OPTIONAL


def test_construct_at_length():
    seq = run("SequenceConstruct", A, B)
    assert isinstance(seq, list) and len(seq) == 2
    assert run("SequenceAt", seq, np.array(-1)) is B
    assert run("SequenceAt", seq, np.array(0, dtype=np.int32)) is A
    n = run("SequenceLength", seq)
    assert n.dtype == np.int64 and n.shape == () and int(n) == 2
    assert int(run("SequenceLength", run("SequenceEmpty", dtype=1))) == 0
    with pytest.raises(InputError, match="out of range"):
        run("SequenceAt", seq, np.array(2))


def test_construct_rejects_mixed_dtypes():
    with pytest.raises(InputError, match="same dtype"):
        run("SequenceConstruct", A, A.astype(np.int64))


def test_insert_and_erase_do_not_mutate_input():
    seq = [A]
    out = run("SequenceInsert", seq, B)
    assert len(seq) == 1 and [x is y for x, y in zip(out, [A, B])] == [True, True]
    out = run("SequenceInsert", seq, B, np.array(0))
    assert out[0] is B
    out = run("SequenceInsert", seq, B, np.array(-1))  # before the last element
    assert out[0] is B
    out = run("SequenceInsert", seq, B, np.array(1))  # == n: at the back
    assert out[1] is B
    with pytest.raises(InputError):
        run("SequenceInsert", seq, B, np.array(2))
    two = [A, B]
    assert run("SequenceErase", two)[0] is A
    assert run("SequenceErase", two, np.array(-2))[0] is B
    assert len(two) == 2
    with pytest.raises(InputError, match="empty"):
        run("SequenceErase", [])


@pytest.mark.parametrize("keepdims", [0, 1])
def test_split_to_sequence_default_is_unit_chunks(keepdims):
    x = np.arange(12).reshape(3, 4)
    seq = run("SplitToSequence", x, axis=-1, keepdims=keepdims)
    assert len(seq) == 4
    expect = x[:, 1:2] if keepdims else x[:, 1]
    np.testing.assert_array_equal(seq[1], expect)


def test_split_to_sequence_scalar_and_list_split():
    x = np.arange(10)
    seq = run("SplitToSequence", x, np.array(4, dtype=np.int64))
    assert [s.tolist() for s in seq] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    seq = run("SplitToSequence", x, np.array([3, 0, 7], dtype=np.int32), keepdims=0)
    assert [s.shape for s in seq] == [(3,), (0,), (7,)]  # keepdims ignored with split
    with pytest.raises(ShapeError, match="sum to"):
        run("SplitToSequence", x, np.array([3, 3]))


def test_split_to_sequence_empty_axis():
    assert run("SplitToSequence", np.zeros((0, 2)), axis=0) == []


def test_concat_from_sequence_and_new_axis():
    seq = [A, A + 1]
    np.testing.assert_array_equal(run("ConcatFromSequence", seq, axis=-1),
                                  np.concatenate(seq, -1))
    np.testing.assert_array_equal(run("ConcatFromSequence", seq, axis=-1, new_axis=1),
                                  np.stack(seq, -1))
    np.testing.assert_array_equal(run("ConcatFromSequence", seq, axis=2, new_axis=1),
                                  np.stack(seq, 2))
    with pytest.raises(ShapeError):
        run("ConcatFromSequence", seq, axis=2)
    with pytest.raises(InputError, match="empty sequence"):
        run("ConcatFromSequence", [], axis=0)
    with pytest.raises(ShapeError, match="cannot concatenate"):
        run("ConcatFromSequence", [A, np.zeros((2, 2, 2), np.float32)], axis=0)


def test_sequence_map_broadcasts_tensors_and_zips_sequences():
    calls = []

    def body(x, y, z):
        calls.append((x.shape, y.shape, z.shape))
        return [x + y + z]

    xs = [np.ones(2), np.ones(3)]
    zs = [np.zeros(2), np.ones(3)]
    out = run("SequenceMap", xs, np.array(10.0), zs, body=body)
    assert isinstance(out, list)
    assert [o.tolist() for o in out] == [[11, 11], [12, 12, 12]]
    with pytest.raises(InputError, match="length"):
        run("SequenceMap", xs, [np.zeros(1)], body=lambda a, b: [a])


def test_sequence_map_several_outputs_and_empty_input():
    body = lambda x: [x, np.array(x.shape, dtype=np.int64)]  # noqa: E731
    a, shapes = run("SequenceMap", [np.zeros((2, 3))], n_outputs=2, body=body)
    assert shapes[0].tolist() == [2, 3]
    a, shapes = run("SequenceMap", [], n_outputs=2, body=body)
    assert a == [] and shapes == []


def test_optional_family():
    assert run("Optional", type=None) is NONE_OPTIONAL
    assert run("Optional", A) is A
    assert run("Optional", [A]) == [A]
    for empty in (None, NONE_OPTIONAL):
        has = run("OptionalHasElement", empty)
        assert has.dtype == np.bool_ and has.shape == () and not bool(has)
    assert bool(run("OptionalHasElement", A))
    assert bool(run("OptionalHasElement", []))  # an empty sequence is still an element
    assert run("OptionalGetElement", A) is A
    with pytest.raises(InputError, match="empty"):
        run("OptionalGetElement", NONE_OPTIONAL)


# ----------------------------------------------------------------------------------- GPU

def _has_gpu() -> bool:
    cp = cupy_module()
    try:
        return cp is not None and cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver or no device
        return False


requires_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
def test_sequence_kernels_on_cupy():
    cp = cupy_module()
    x = cp.arange(10)
    seq = run("SplitToSequence", x, cp.asarray(np.array([3, 7])))
    assert all(isinstance(s, cp.ndarray) for s in seq)
    n = run("SequenceLength", seq)
    assert isinstance(n, cp.ndarray) and int(n) == 2
    back = run("ConcatFromSequence", seq, axis=0)
    np.testing.assert_array_equal(cp.asnumpy(back), np.arange(10))
    assert run("SequenceAt", seq, cp.asarray(np.array(-1))) is seq[1]
