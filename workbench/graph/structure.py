"""Reading a model's structure without its weights: ``load(path, weights=False)``.

A viewer needs the graph (nodes, names, attributes, value types and shapes) and, of each
tensor, its type, dims and size, never its values; a 1 GiB initializer should cost what its
description costs. Protobuf has no lazy fields, so this module walks the file's protobuf wire
format itself (a big file is read through ``pread`` a window at a time, not mapped: a mapping
would count against an address-space limit; only the windows holding the fields it reads or
copies are read) and writes a smaller ModelProto in which every tensor holding more than
``keep_bytes`` of data has its data fields left out and is marked *described*
(``external.set_mark``: where its bytes are and how many). The rest of the loader then
treats described tensors as :class:`~workbench.graph.external.UnreadTensor`
(``external.describing``).

What it descends into is read from onnx's message descriptors: the fields that can hold a
tensor (graph, nodes, attributes, subgraphs, sparse tensors, training info, functions).
Every other field, and every message no longer than ``keep_bytes``, is copied byte for byte.
Malformed input (a length past the end, a bad varint, a group) is a
:class:`~workbench.errors.ModelLoadError`, as a failed protobuf parse is; the output is then
parsed by protobuf as usual. Linear in the size of the structure (the fields walked), not in
the size of the weights.
"""

from __future__ import annotations

import os

import onnx

from workbench.errors import ModelLoadError
from workbench.graph.external import set_mark

#: tensors with at most this many bytes of data stay whole (shape computations, scales)
KEEP_BYTES = 4096
#: nesting of subgraphs beyond this is refused (protobuf's own parser stops at 100)
MAX_DEPTH = 100
#: files up to this size are read whole; bigger ones a window at a time
READ_WHOLE = 64 << 20


class FileBytes:
    """A file's bytes by index and slice, read with ``pread`` one window at a time (the
    window holding the last byte asked for is kept): the structure reader touches the
    fields' headers and the structure, never the bulk of a big tensor."""

    WINDOW = 1 << 20

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self.base, self.data = -1, b""

    def __len__(self) -> int:
        return self.size

    def _read(self, start: int, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.pread(self.fd, n - len(out), start + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def __getitem__(self, k):
        if isinstance(k, slice):
            start, stop, _ = k.indices(self.size)
            return self._read(start, max(0, stop - start))
        i = k - self.base
        if 0 <= i < len(self.data):
            return self.data[i]
        if not 0 <= k < self.size:
            raise IndexError(k)
        self.base = k - k % self.WINDOW
        self.data = self._read(self.base, self.WINDOW)
        return self.data[k - self.base]


class _Malformed(Exception):
    pass


def _fields(message_cls, *names) -> dict:
    d = message_cls.DESCRIPTOR
    return {d.fields_by_name[n].number: n for n in names if n in d.fields_by_name}


_MODEL, _GRAPH, _NODE, _ATTR, _TENSOR, _SPARSE, _TRAIN, _FUNC = range(8)
# for each message kind: field number -> the kind of message it holds (fields that can hold a
# tensor, directly or further down)
_DESCEND = {
    _MODEL: {n: k for names, k in ((("graph",), _GRAPH), (("training_info",), _TRAIN),
                                   (("functions",), _FUNC))
             for n in _fields(onnx.ModelProto, *names)},
    _GRAPH: {n: k for names, k in ((("node",), _NODE), (("initializer",), _TENSOR),
                                   (("sparse_initializer",), _SPARSE))
             for n in _fields(onnx.GraphProto, *names)},
    _NODE: {n: _ATTR for n in _fields(onnx.NodeProto, "attribute")},
    _ATTR: {n: k for names, k in ((("t", "tensors"), _TENSOR), (("g", "graphs"), _GRAPH),
                                  (("sparse_tensor", "sparse_tensors"), _SPARSE))
            for n in _fields(onnx.AttributeProto, *names)},
    _SPARSE: {n: _TENSOR for n in _fields(onnx.SparseTensorProto, "values", "indices")},
    _TRAIN: {n: _GRAPH for n in _fields(onnx.TrainingInfoProto, "initialization",
                                        "algorithm")},
    _FUNC: {n: k for names, k in ((("node",), _NODE), (("attribute_proto",), _ATTR))
            for n in _fields(onnx.FunctionProto, *names)},
}
_DATA = _fields(onnx.TensorProto, "float_data", "int32_data", "string_data", "int64_data",
                "raw_data", "double_data", "uint64_data")
_EXTERNAL = set(_fields(onnx.TensorProto, "external_data", "data_location"))


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise _Malformed("a number runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed("a number longer than 10 bytes")


def _encode_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Skimmer:
    def __init__(self, buf, keep: int, mark: str):
        self.buf, self.keep, self.mark = buf, keep, mark
        self.described = 0            # tensors left out
        self.described_bytes = 0      # ... and the bytes of data they hold

    def _skip(self, wt: int, pos: int, end: int) -> tuple[int, int]:
        """Skip a field's value of wire type ``wt``; returns (new pos, its length)."""
        if wt == 0:
            start = pos
            _, pos = _varint(self.buf, pos, end)
            return pos, pos - start
        if wt == 1:
            n = 8
        elif wt == 5:
            n = 4
        elif wt == 2:
            n, pos = _varint(self.buf, pos, end)
        else:
            raise _Malformed(f"wire type {wt} (groups are not used by ONNX)")
        if pos + n > end:
            raise _Malformed("a field runs past the end of its message")
        return pos + n, n

    def message(self, kind: int, start: int, end: int, depth: int):
        """The message's new bytes, or None when nothing in it changes."""
        if end - start <= self.keep:
            return None
        if depth > MAX_DEPTH:
            raise _Malformed(f"subgraphs nested more than {MAX_DEPTH} levels deep")
        if kind == _TENSOR:
            return self._tensor(start, end)
        buf, descend = self.buf, _DESCEND[kind]
        pieces, copied, pos = [], start, start
        while pos < end:
            fstart = pos
            key, pos = _varint(buf, pos, end)
            field, wt = key >> 3, key & 7
            sub = descend.get(field) if wt == 2 else None
            if sub is None:
                pos, _ = self._skip(wt, pos, end)
                continue
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise _Malformed("a field runs past the end of its message")
            new = self.message(sub, pos, pos + n, depth + 1) if n > self.keep else None
            if new is not None:
                pieces.append(buf[copied:fstart])
                pieces.append(_encode_varint(key) + _encode_varint(len(new)))
                pieces.append(new)
                copied = pos + n
            pos += n
        if not pieces:
            return None
        pieces.append(buf[copied:end])
        return b"".join(pieces)

    def _tensor(self, start: int, end: int):
        buf = self.buf
        pieces, copied, pos = [], start, start
        stored, kinds, first = 0, set(), None
        while pos < end:
            fstart = pos
            key, pos = _varint(buf, pos, end)
            field, wt = key >> 3, key & 7
            pos, n = self._skip(wt, pos, end)
            if field in _DATA:
                stored += n
                kinds.add(_DATA[field])
                if first is None:
                    first = pos - n               # where the data starts in the file
            elif field not in _EXTERNAL:
                continue
            # a data field (or external-data entries of a tensor that also holds data: the
            # mark replaces them) is left out
            pieces.append(buf[copied:fstart])
            copied = pos
        if stored <= self.keep:
            return None
        pieces.append(buf[copied:end])
        t = onnx.TensorProto()
        set_mark(t, self.mark, " + ".join(sorted(kinds)), first or 0, stored)
        self.described += 1
        self.described_bytes += stored
        return b"".join(pieces) + t.SerializeToString()


def read_structure(buf, mark: str, *, keep_bytes: int = KEEP_BYTES,
                   path: str | None = None) -> tuple[onnx.ModelProto, int, int]:
    """Parse the serialised model in ``buf`` (bytes, or an mmap of the file) with the data of
    tensors above ``keep_bytes`` left out and marked with ``mark``. Returns (model, number of
    tensors described, bytes of data they hold)."""
    sk = _Skimmer(buf, keep_bytes, mark)
    try:
        new = sk.message(_MODEL, 0, len(buf), 0)
    except _Malformed as e:
        raise ModelLoadError(
            f"not a valid ONNX model: the protobuf could not be parsed ({e}); the file may be "
            f"truncated, corrupt, or not an .onnx file ({len(buf):,} bytes)", path=path) from None
    m = onnx.ModelProto()
    try:
        m.ParseFromString(buf[0:len(buf)] if new is None else new)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ModelLoadError(
            f"not a valid ONNX model: the protobuf could not be parsed ({e}); the file may be "
            f"truncated, corrupt, or not an .onnx file ({len(buf):,} bytes)", path=path) from None
    return m, sk.described, sk.described_bytes


def read_structure_file(path: str, mark: str, size: int) -> tuple[onnx.ModelProto, int, int]:
    """:func:`read_structure` of the file at ``path`` (``size`` bytes)."""
    with open(path, "rb") as f:
        if size <= READ_WHOLE:
            return read_structure(f.read(), mark, path=path)
        return read_structure(FileBytes(f.fileno(), size), mark, path=path)
