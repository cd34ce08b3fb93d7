"""Image and text pre-processing of the zoo demos against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from workbench.errors import InputError
from workbench.zoo import preprocess as pre
from workbench.zoo.tokenizers import BertTokenizer

MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def _uniform(colour, size=(37, 53), mode="RGB"):
    return Image.new(mode, size, colour)


# --------------------------------------------------------------------------- load_image
@pytest.mark.parametrize("image, want", [
    (_uniform((10, 20, 30, 255), mode="RGBA"), (10, 20, 30)),
    (_uniform(77, mode="L"), (77, 77, 77)),
    (np.full((5, 7), 200, np.uint8), (200, 200, 200)),                  # HxW gray
    (np.full((5, 7, 1), 9, np.uint8), (9, 9, 9)),                       # HxWx1
    (np.full((3, 5, 7), 0.5, np.float32), (128, 128, 128)),              # CHW float in [0, 1]
    (np.full((5, 7, 4), 40, np.uint8), (40, 40, 40)),                   # HxWx4
    (np.full((5, 7, 3), 300.0), (255, 255, 255)),                       # floats clipped
])
def test_load_image_converts_any_mode_to_rgb(image, want):
    img = pre.load_image(image)
    assert img.mode == "RGB"
    assert img.getpixel((0, 0)) == want


def test_load_image_palette_and_path(tmp_path):
    p = _uniform((1, 2, 3)).convert("P", palette=Image.Palette.ADAPTIVE)
    assert pre.load_image(p).getpixel((0, 0)) == (1, 2, 3)
    f = tmp_path / "x.png"
    _uniform((250, 0, 5)).save(f)
    assert pre.load_image(str(f)).getpixel((3, 3)) == (250, 0, 5)
    assert pre.load_image(f, "L").mode == "L"


@pytest.mark.parametrize("mode", ["1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa",
                                  "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I", "I;16", "I;16B",
                                  "F"])
def test_every_pil_mode_is_accepted(mode):
    img = Image.new(mode, (33, 21))
    assert pre.imagenet(img).shape == (1, 3, 224, 224)
    assert pre.ferplus(img).shape == (1, 1, 64, 64)
    assert pre.arcface(img).shape == (1, 3, 112, 112)
    assert pre.tiny_yolo(img, 64)[0].shape == (1, 3, 64, 64)


def test_high_range_gray_is_scaled_not_clipped():
    a = np.array([[0, 257 * 100, 65535]], np.uint16)
    assert np.asarray(pre.load_image(Image.fromarray(a), "L")).tolist() == [[0, 100, 255]]
    f = Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32))
    assert np.asarray(pre.load_image(f, "L")).tolist() == [[0, 128, 255]]


def test_load_image_bad_inputs():
    with pytest.raises(InputError, match="does not exist"):
        pre.load_image("/nonexistent/image.jpg")
    with pytest.raises(InputError, match="HxW"):
        pre.load_image(np.zeros((2, 3, 4, 5)))


# --------------------------------------------------------------------------- ImageNet
def test_imagenet_uniform_colour_is_normalised_per_channel():
    x = pre.imagenet(_uniform((255, 128, 0), size=(300, 100)))   # any size, aspect not kept
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    want = (np.array([255, 128, 0]) / 255.0 - MEAN) / STD
    np.testing.assert_allclose(x[0, :, 100, 100], want, rtol=1e-6)
    assert np.ptp(x.reshape(3, -1), axis=1).tolist() == [0, 0, 0]


def test_imagenet_crop_box_is_16_16_240_240():
    # a 256x256 image is not resampled; pixel (x, y) encodes its position
    yy, xx = np.mgrid[0:256, 0:256]
    a = np.stack([xx, yy, np.zeros_like(xx)], -1).astype(np.uint8)
    x = pre.imagenet(a)
    r = x[0, 0] * STD[0] + MEAN[0]          # back to 0..1
    g = x[0, 1] * STD[1] + MEAN[1]
    np.testing.assert_allclose(r[0, 0] * 255, 16, atol=1e-3)       # left edge: column 16
    np.testing.assert_allclose(r[0, -1] * 255, 239, atol=1e-3)     # right edge: column 239
    np.testing.assert_allclose(g[-1, 0] * 255, 239, atol=1e-3)     # bottom edge: row 239


def test_imagenet_grayscale_and_rgba_inputs_give_three_channels():
    x = pre.imagenet(_uniform(51, mode="L"))
    np.testing.assert_allclose(x[0, :, 5, 5], (0.2 - MEAN) / STD, rtol=1e-5)
    assert pre.imagenet(_uniform((1, 2, 3, 4), mode="RGBA")).shape == (1, 3, 224, 224)


# --------------------------------------------------------------------------- other images
def test_tiny_yolo_is_raw_0_255_and_resized():
    x, img = pre.tiny_yolo(_uniform((200, 100, 50), size=(640, 480)))
    assert x.shape == (1, 3, 416, 416) and img.size == (416, 416)
    np.testing.assert_array_equal(x[0, :, 7, 9], [200, 100, 50])
    assert pre.tiny_yolo(np.zeros((10, 10), np.uint8), size=160)[0].shape == (1, 3, 160, 160)


def test_arcface_centre_crops_the_longer_side():
    a = np.zeros((100, 200, 3), np.uint8)         # 200 wide, 100 high
    a[:, :50] = (255, 0, 0)
    a[:, 150:] = (0, 0, 255)
    a[:, 50:150] = (0, 255, 0)                    # the centre square is all green
    x = pre.arcface([a, Image.fromarray(a).rotate(90, expand=True)])
    assert x.shape == (2, 3, 112, 112) and x.dtype == np.float32
    np.testing.assert_array_equal(x[0, :, ::10, ::10].reshape(3, -1).T[0], [0, 255, 0])
    assert np.all(x[0, 1] == 255) and np.all(x[0, 0] == 0) and np.all(x[1, 1] == 255)
    assert pre.arcface(a).shape == (1, 3, 112, 112)


def test_ferplus_is_grayscale_raw_pixels():
    x = pre.ferplus(_uniform((255, 0, 0), size=(48, 80)))
    assert x.shape == (1, 1, 64, 64) and x.dtype == np.float32
    # ITU-R 601-2 luma as PIL computes it: 255 * 299 / 1000 = 76.2 -> 76
    assert np.all(x == 76)
    assert pre.ferplus(_uniform((9, 9, 9, 0), mode="RGBA")).max() == 9


# --------------------------------------------------------------------------- SQuAD features
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "who", "is", "he", "?", "john", "smith", "lives",
         "in", "paris", ".", "and", "works", "there", "##s"]


def test_squad_features_single_window():
    tok = BertTokenizer(VOCAB)
    ex = pre.squad_features(tok, "Who is he?", "John Smith lives in Paris.", max_seq_length=16)
    assert ex.doc_tokens == ["John", "Smith", "lives", "in", "Paris."]
    (f,) = ex.features
    assert f.tokens == ["[CLS]", "who", "is", "he", "?", "[SEP]", "john", "smith", "lives", "in",
                        "paris", ".", "[SEP]"]
    assert f.input_ids.tolist() == [2, 4, 5, 6, 7, 3, 8, 9, 10, 11, 12, 13, 3, 0, 0, 0]
    assert f.segment_ids.tolist() == [0] * 6 + [1] * 7 + [0] * 3
    assert f.input_mask.tolist() == [1] * 13 + [0] * 3
    assert f.token_to_orig_map == {6: 0, 7: 1, 8: 2, 9: 3, 10: 4, 11: 4}
    assert all(f.token_is_max_context.values())
    assert f.input_ids.dtype == np.int64


def test_squad_features_windows_with_stride():
    tok = BertTokenizer(VOCAB)
    context = "john lives in paris and works there . " * 3    # 24 tokens
    ex = pre.squad_features(tok, "who?", context, max_seq_length=16, doc_stride=5)
    # room for 16 - 2 - 3 = 11 context tokens per window; starts 0, 5, 10, 15 (ends 24)
    spans = [min(f.token_to_orig_map) for f in ex.features]
    assert len(ex.features) == 4
    assert [f.token_to_orig_map[min(f.token_to_orig_map)] for f in ex.features] == \
        [0, 5, 10, 15]
    assert spans == [4] * 4                                        # after [CLS] who ? [SEP]
    assert [f.unique_id for f in ex.features] == [1000000000 + i for i in range(4)]
    # context token 7 is in windows 0 (pos 7 of 0..10) and 1 (pos 2 of 5..15): best in 0
    f0, f1 = ex.features[:2]
    assert f0.token_is_max_context[4 + 7] and not f1.token_is_max_context[4 + 2]
    # context token 8: window 0 pos 8 (score min(8, 2) = 2), window 1 pos 3 (min(3, 7) = 3)
    assert not f0.token_is_max_context[4 + 8] and f1.token_is_max_context[4 + 3]
    assert all(len(f.input_ids) == 16 for f in ex.features)


def test_squad_long_question_is_truncated_with_warning():
    tok = BertTokenizer(VOCAB)
    with pytest.warns(UserWarning, match="70 tokens, more than the 64"):
        ex = pre.squad_features(tok, "who " * 70, "john", max_seq_length=80)
    assert ex.features[0].tokens[1:66].count("who") == 64


def test_truncate_keeps_head_or_tail():
    with pytest.warns(UserWarning, match="5 tokens, more than the 3"):
        assert pre.truncate([1, 2, 3, 4, 5], 3, "x") == [1, 2, 3]
    with pytest.warns(UserWarning):
        assert pre.truncate([1, 2, 3, 4, 5], 3, "x", keep="tail") == [3, 4, 5]
    assert pre.truncate([1, 2], 3, "x") == [1, 2]
