"""What a file that is not an ONNX model is, from its first bytes, and how to get an ONNX
model from it.

The loader asks :func:`identify` only after a file failed to parse as an ONNX model (a valid
model is never second-guessed). It recognises the files people hand to an ONNX tool by
mistake: PyTorch checkpoints and TorchScript archives, TensorFlow SavedModels, Keras files,
TensorFlow Lite, safetensors, GGUF, ONNX Runtime's ``.ort`` format, NumPy arrays, Python
pickles, and the two things a download often saves instead of a model (a web page, a Git LFS
pointer). Nothing is loaded or unpickled: the signatures are read from the first bytes (and,
for ZIP archives, from the archive's list of member names).
"""

from __future__ import annotations

import io
import os
import zipfile

#: bytes read from the start of a file to recognise it
HEAD_BYTES = 4096

_TORCH_EXPORT = ("export it to ONNX with PyTorch: build the model (its Python class), load the "
                 "weights, then torch.onnx.export(model, example_input, 'model.onnx')")
_TF2ONNX = "pip install tf2onnx; "


def _zip_names(path: str | None, data: bytes | None) -> list:
    try:
        src = io.BytesIO(data) if data is not None else path
        with zipfile.ZipFile(src) as z:
            return z.namelist()[:10_000]
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, RuntimeError):
        return []


def _zip_kind(names: list) -> str | None:
    base = {n.rsplit("/", 1)[-1] for n in names}
    dirs = {p for n in names for p in n.split("/")[1:-1]}
    if "code" in dirs or any("/code/" in n for n in names) or "constants.pkl" in base:
        return ("a TorchScript archive (torch.jit.save), not an ONNX model. Export it to ONNX: "
                "m = torch.jit.load(path); torch.onnx.export(m, example_input, 'model.onnx', "
                "dynamo=False)")
    if "data.pkl" in base:
        return ("a PyTorch file saved by torch.save (a checkpoint or state_dict: weights, no "
                "graph), not an ONNX model. " + _TORCH_EXPORT[0].upper() + _TORCH_EXPORT[1:])
    if "model.weights.h5" in base and base & {"config.json", "metadata.json"}:
        return ("a Keras 3 model (.keras), not an ONNX model. Convert it: " + _TF2ONNX +
                "model = keras.models.load_model(path); tf2onnx.convert.from_keras(model, "
                "output_path='model.onnx') (or export a SavedModel first: model.export(dir))")
    if names and all(n.endswith(".npy") for n in names):
        return "a NumPy .npz archive of arrays (np.savez), not a model"
    if any(n.endswith(".onnx") for n in names):
        inner = next(n for n in names if n.endswith(".onnx"))
        return (f"a ZIP archive holding {inner!r}: unpack it and open the .onnx file (keep any "
                f"external data files beside it)")
    return None


def identify(path: str | None = None, data: bytes | None = None) -> str | None:
    """What the file at ``path`` (or the bytes ``data``) is, when it is a known format other
    than ONNX, and how to make an ONNX model of it; None when unknown."""
    if path is not None and os.path.isdir(path):
        return identify_folder(path)
    if data is None:
        try:
            with open(path, "rb") as f:
                head = f.read(HEAD_BYTES)
        except OSError:
            return None
    else:
        head = bytes(data[:HEAD_BYTES])
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_kind(_zip_names(path if data is None else None, data)) or (
            "a ZIP archive, not an ONNX model (an .onnx file is a protobuf, never a ZIP)")
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return ("an HDF5 file (a Keras .h5 model or weights), not an ONNX model. Convert a "
                "Keras model: " + _TF2ONNX + "python -m tf2onnx.convert --keras model.h5 "
                "--output model.onnx")
    if head[4:8] == b"TFL3":
        return ("a TensorFlow Lite model (.tflite), not an ONNX model. Convert it: " + _TF2ONNX
                + "python -m tf2onnx.convert --tflite model.tflite --output model.onnx")
    if head[4:8] == b"ORTM":
        return ("an ONNX Runtime .ort file (its own FlatBuffers format, made from an .onnx "
                "model by onnxruntime's converter): open the .onnx file it was made from")
    if head.startswith(b"GGUF"):
        return ("a GGUF file (llama.cpp's format for language models), not an ONNX model; "
                "export the original model (e.g. from Hugging Face) to ONNX instead "
                "(optimum-cli export onnx --model NAME out/)")
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array (np.save), not a model"
    if len(head) >= 10 and head[8:9] == b"{" and \
            int.from_bytes(head[:8], "little") < (100 << 20):
        return ("a safetensors file (weights only, no graph), not an ONNX model. Export the "
                "model it belongs to: for Hugging Face models, optimum-cli export onnx --model "
                "NAME_OR_FOLDER out/; for PyTorch, torch.onnx.export")
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return ("a Python pickle (PyTorch's older torch.save format, a pickled scikit-learn "
                "model, ...), not an ONNX model; never unpickle files from people you do not "
                "trust. PyTorch: " + _TORCH_EXPORT + "; scikit-learn: skl2onnx.to_onnx(model, "
                "X[:1])")
    text = head.lstrip()[:200].lower()
    if text.startswith(b"version https://git-lfs.github.com/spec/"):
        return ("a Git LFS pointer (a few lines of text standing for the real file), not the "
                "model itself: fetch the file with `git lfs pull` (or download it from the "
                "repository's 'raw'/'download' link)")
    if text.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head")):
        return ("a web page (HTML), not a model: the download saved the page that shows the "
                "file; download the file itself (the 'raw' or 'download' link)")
    if text.startswith(b"ir_version") or (text.startswith(b"<") and b"ir_version" in text):
        return ("a model in ONNX text format, not a binary .onnx file: convert it with "
                "onnx.save(onnx.parser.parse_model(text), 'model.onnx')")
    if path is not None and path.endswith((".pb", ".pbtxt")):
        return ("a protobuf file that is not an ONNX model: a .pb file is often a TensorFlow "
                "frozen graph or a SavedModel's saved_model.pb. Convert it: " + _TF2ONNX +
                "python -m tf2onnx.convert --graphdef model.pb --inputs IN:0 --outputs OUT:0 "
                "--output model.onnx (or --saved-model FOLDER)")
    return None


def identify_folder(path: str) -> str | None:
    """What a folder given as a model is (a TensorFlow SavedModel, a folder holding .onnx
    files), and what to do."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    if "saved_model.pb" in names or "saved_model.pbtxt" in names:
        return ("a TensorFlow SavedModel folder, not an ONNX model. Convert it: " + _TF2ONNX +
                "python -m tf2onnx.convert --saved-model FOLDER --output model.onnx")
    onnx_files = [n for n in names if n.endswith(".onnx")]
    if onnx_files:
        shown = ", ".join(onnx_files[:5]) + (" ..." if len(onnx_files) > 5 else "")
        return f"is a folder; it holds {shown}: give the path of one of those files"
    return None
