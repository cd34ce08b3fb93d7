"""NonMaxSuppression, Dropout and ImageDecoder kernels."""

from __future__ import annotations

import builtins
import io

import numpy as np
import pytest

from workbench.arrays import cupy_module
from workbench.errors import InputError, ShapeError, UnsupportedOperatorError
from workbench.ops.registry import NodeContext, attribute_defaults, lookup


def run(op, *inputs, opset=22, n_outputs=1, training=False, rng=None, **attrs):
    entry = lookup(op, "", opset)
    kw = dict(attribute_defaults(op, "", opset))
    kw.update(attrs)
    if entry.wants_ctx:
        kw["ctx"] = NodeContext(node_name="n", op_type=op, opset=opset, n_outputs=n_outputs,
                                training=training, rng=rng)
    return entry.fn(*inputs, **kw)


# --------------------------------------------------------------------- NonMaxSuppression

BOXES = np.array([[[0.0, 0.0, 1.0, 1.0],
                   [0.0, 0.1, 1.0, 1.1],
                   [0.0, -0.1, 1.0, 0.9],
                   [0.0, 10.0, 1.0, 11.0],
                   [0.0, 10.1, 1.0, 11.1],
                   [0.0, 100.0, 1.0, 101.0]]], np.float32)
SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], np.float32)


def nms(boxes=BOXES, scores=SCORES, max_out=3, iou=0.5, score=None, **kw):
    args = [boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32)]
    if score is not None:
        args.append(np.array([score], np.float32))
    return run("NonMaxSuppression", *args, **kw)


def test_nms_basic_selection_order():
    out = nms()
    assert out.dtype == np.int64 and out.shape == (3, 3)
    assert out.tolist() == [[0, 0, 3], [0, 0, 0], [0, 0, 5]]


def test_nms_score_threshold_is_strict_and_limit_applies():
    assert nms(score=0.3).tolist() == [[0, 0, 3], [0, 0, 0]]
    assert nms(max_out=1).tolist() == [[0, 0, 3]]


def test_nms_flipped_corners_and_center_format_agree():
    flipped = BOXES[:, :, [2, 3, 0, 1]]
    assert nms(boxes=flipped).tolist() == nms().tolist()
    y1, x1, y2, x2 = (BOXES[0, :, k] for k in range(4))
    center = np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1)[None]
    assert nms(boxes=center, center_point_box=1).tolist() == nms().tolist()


def test_nms_iou_equal_to_threshold_is_kept():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 2]]], np.float32)  # IoU exactly 0.5
    scores = np.array([[[0.9, 0.8]]], np.float32)
    assert len(nms(boxes, scores, iou=0.5)) == 2
    assert len(nms(boxes, scores, iou=0.49)) == 1


def test_nms_batches_classes_and_empty_result():
    boxes = np.concatenate([BOXES, BOXES])
    scores = np.concatenate([SCORES, SCORES])
    scores = np.concatenate([scores, scores[:, :, ::-1]], axis=1)  # 2 classes
    out = nms(boxes, scores, max_out=2)
    assert out.shape == (8, 3)
    assert out[:, :2].tolist() == [[0, 0]] * 2 + [[0, 1]] * 2 + [[1, 0]] * 2 + [[1, 1]] * 2
    empty = run("NonMaxSuppression", BOXES, SCORES)  # max_output_boxes_per_class defaults to 0
    assert empty.shape == (0, 3) and empty.dtype == np.int64


def test_nms_identical_boxes_keep_lowest_index():
    boxes = np.tile(np.array([0, 0, 1, 1], np.float32), (1, 4, 1))
    scores = np.full((1, 1, 4), 0.9, np.float32)
    assert nms(boxes, scores).tolist() == [[0, 0, 0]]


def test_nms_shape_errors():
    with pytest.raises(ShapeError, match="boxes"):
        run("NonMaxSuppression", np.zeros((1, 3, 5), np.float32), np.zeros((1, 1, 3)))
    with pytest.raises(ShapeError, match="scores"):
        run("NonMaxSuppression", np.zeros((1, 3, 4), np.float32), np.zeros((1, 1, 4)))


# ------------------------------------------------------------------------------ Dropout

X = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)


def test_dropout_inference_is_identity_with_true_mask():
    y, mask = run("Dropout", X, np.array(0.7, np.float32), n_outputs=2)
    assert y is X and mask.dtype == np.bool_ and mask.all()
    assert run("Dropout", X, opset=12) is X


def test_dropout_old_opsets_mask_dtype():
    y, mask = run("Dropout", X, opset=7, n_outputs=2, ratio=0.2)
    assert y is X and mask.dtype == np.float32 and (mask == 1).all()
    _, mask = run("Dropout", X, opset=10, n_outputs=2)
    assert mask.dtype == np.bool_


def test_dropout_training_with_seed_is_reproducible_and_scaled():
    r, t = np.array(0.75, np.float32), np.array(True)
    y1, m1 = run("Dropout", X, r, t, n_outputs=2, seed=3)
    y2, m2 = run("Dropout", X, r, t, n_outputs=2, seed=3)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(m1, m2)
    assert m1.dtype == np.bool_ and 0 < m1.mean() < 0.6
    np.testing.assert_allclose(y1, X * m1 / 0.25, rtol=1e-6)
    # same draw as numpy.random.seed(3); numpy.random.uniform(0, 1, shape) >= ratio
    ref = np.random.RandomState(3).uniform(0, 1, X.shape) >= 0.75
    np.testing.assert_array_equal(m1, ref)


def test_dropout_training_uses_context_rng_and_zero_ratio():
    rng = np.random.default_rng(1)
    y, m = run("Dropout", X, np.array(0.5, np.float32), np.array(True), n_outputs=2, rng=rng)
    assert not m.all() and m.any()
    y, m = run("Dropout", X, np.array(0.0, np.float32), np.array(True), n_outputs=2)
    assert y is X and m.all()


def test_dropout_old_opset_follows_training_flag():
    y, m = run("Dropout", X, opset=10, n_outputs=2, training=True,
               rng=np.random.default_rng(0), ratio=0.5)
    assert not m.all()
    np.testing.assert_allclose(y, X * m * 2, rtol=1e-6)


def test_dropout_12_without_training_mode_follows_engine_flag():
    y, m = run("Dropout", X, n_outputs=2, training=True, rng=np.random.default_rng(0))
    assert not m.all()
    y, m = run("Dropout", X, None, np.array(False), n_outputs=2, training=True)
    assert y is X and m.all()


def test_dropout_bfloat16_training():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    xb = X.astype(ml_dtypes.bfloat16)
    y = run("Dropout", xb, np.array(0.5, np.float32), np.array(True), seed=0)
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == X.shape


def test_dropout_bad_ratio():
    with pytest.raises(InputError, match="ratio"):
        run("Dropout", X, np.array(1.5, np.float32), np.array(True))


# ------------------------------------------------------------------------- ImageDecoder


def _encode(fmt, arr):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


@pytest.fixture
def png_image():
    pytest.importorskip("PIL")
    img = np.random.default_rng(0).integers(0, 255, size=(5, 7, 3), dtype=np.uint8)
    return img, _encode("PNG", img)


def test_image_decoder_rgb_bgr(png_image):
    img, data = png_image
    rgb = run("ImageDecoder", data, opset=20)
    assert rgb.dtype == np.uint8 and rgb.shape == (5, 7, 3)
    np.testing.assert_array_equal(rgb, img)
    bgr = run("ImageDecoder", data, opset=20, pixel_format="BGR")
    np.testing.assert_array_equal(bgr, img[:, :, ::-1])


def test_image_decoder_grayscale(png_image):
    img, data = png_image
    gray = run("ImageDecoder", data, opset=20, pixel_format="Grayscale")
    assert gray.shape == (5, 7, 1)
    luma = img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.abs(gray[..., 0].astype(np.float64) - luma).max() <= 1


def test_image_decoder_garbage_gives_empty_image():
    pytest.importorskip("PIL")
    with pytest.warns(RuntimeWarning, match="cannot decode"):
        out = run("ImageDecoder", np.arange(20, dtype=np.uint8), opset=20)
    assert out.shape == (0, 0, 3) and out.dtype == np.uint8


def test_image_decoder_bad_pixel_format():
    with pytest.raises(InputError, match="pixel_format"):
        run("ImageDecoder", np.zeros(4, np.uint8), opset=20, pixel_format="RGBA")


def test_image_decoder_without_pillow(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("no PIL")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(UnsupportedOperatorError, match="pip install pillow"):
        run("ImageDecoder", np.zeros(4, np.uint8), opset=20)


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
def test_nms_and_dropout_on_cupy_match_numpy():
    cp = cupy_module()
    out = run("NonMaxSuppression", cp.asarray(BOXES), cp.asarray(SCORES),
              cp.asarray(np.array([3], np.int64)), cp.asarray(np.array([0.5], np.float32)))
    assert isinstance(out, cp.ndarray)
    assert cp.asnumpy(out).tolist() == nms().tolist()
    r, t = np.array(0.5, np.float32), np.array(True)
    y, m = run("Dropout", cp.asarray(X), cp.asarray(r), cp.asarray(t), n_outputs=2, seed=1)
    y0, m0 = run("Dropout", X, r, t, n_outputs=2, seed=1)
    np.testing.assert_array_equal(cp.asnumpy(m), m0)
    np.testing.assert_allclose(cp.asnumpy(y), y0, rtol=1e-6)
