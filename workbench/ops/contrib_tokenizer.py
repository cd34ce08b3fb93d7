"""com.microsoft text-feature kernels that skl2onnx writes, from onnxruntime's
ContribOperators specification: Tokenizer (since 1; CountVectorizer / TfidfVectorizer) and
MurmurHash3 (since 1; FeatureHasher).

Tokenizer:

Each string of a [C] or [N, C] string tensor becomes a row of tokens along a new last axis,
padded with ``pad_value`` to the longest row: [C, D] or [N, C, D]. Two modes:

- ``tokenexp`` (a regular expression): the tokens are its successive matches, searched from
  the start of the string and again after each match (characters that start no match are
  skipped);
- ``separators`` (regular expressions): the string is split at their matches; empty pieces
  are dropped. A single empty separator splits into characters.

Tokens shorter than ``mincharnum`` are dropped; ``mark`` adds ``"\\x02"`` before and
``"\\x03"`` after each string's tokens.
"""

from __future__ import annotations

import re

import numpy as np

from workbench.errors import InputError, ShapeError
from workbench.ops.registry import kernel

MS = "com.microsoft"


def _tokens(s: str, pattern, char_mode: bool, split: bool, minchar: int, mark: bool):
    if char_mode:
        toks = list(s)
    elif split:
        toks = [t for t in pattern.split(s) if t]
    else:
        toks = [m.group(0) for m in pattern.finditer(s) if m.group(0)]
    if minchar > 1:
        toks = [t for t in toks if len(t) >= minchar]
    if mark:
        toks = ["\x02"] + toks + ["\x03"]
    return toks


@kernel("Tokenizer", since=1, domain=MS)
def tokenizer(X, *, mark=None, mincharnum=None, pad_value=None, separators=None,
              tokenexp=None):
    op = "Tokenizer"
    for name, v in (("mark", mark), ("mincharnum", mincharnum), ("pad_value", pad_value)):
        if v is None:
            raise InputError(f"{op}: attribute {name} is required")
    x = np.asarray(X)
    if x.dtype.kind not in "OUS":
        raise InputError(f"{op}: X must be a string tensor, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise ShapeError(f"{op}: X must be [C] or [N, C], got shape {list(x.shape)}")
    seps = [s.decode() if isinstance(s, bytes) else s for s in (separators or [])]
    if tokenexp and seps:
        raise InputError(f"{op}: set tokenexp or separators, not both")
    if not tokenexp and not seps:
        raise InputError(f"{op}: one of tokenexp and separators must be set")
    char_mode = seps == [""]
    try:
        if tokenexp:
            pattern = re.compile(tokenexp.decode() if isinstance(tokenexp, bytes) else tokenexp)
        elif not char_mode:
            pattern = re.compile("|".join(f"(?:{s})" for s in seps if s))
        else:
            pattern = None
    except re.error as e:
        raise InputError(f"{op}: invalid regular expression: {e}") from None
    pad = pad_value.decode() if isinstance(pad_value, bytes) else str(pad_value)
    flat = x.reshape(-1).tolist()
    rows = [_tokens(s.decode() if isinstance(s, bytes) else str(s), pattern, char_mode,
                    not tokenexp, int(mincharnum), bool(mark)) for s in flat]
    d = max((len(r) for r in rows), default=0)
    out = np.empty((len(rows), d), dtype=object)
    out[:] = pad
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out.reshape(x.shape + (d,))


# ---------------------------------------------------------------------------------- MurmurHash3
# MurmurHash3_x86_32 (Austin Appleby's published algorithm): 4-byte little-endian blocks mixed
# into the state, the 1-3 tail bytes mixed once, then the length and the final avalanche
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_HASHABLE = ("uint32", "int32", "uint64", "int64", "float32", "float64")


def _rotl(x, r: int):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_block(k):
    k = k * np.uint32(_C1)
    return _rotl(k, 15) * np.uint32(_C2)


def murmur3_x86_32(data, lengths, seed: int):
    """MurmurHash3_x86_32 of n byte strings at once: ``data`` uint8 (n, width) holds string i
    in its first ``lengths[i]`` bytes (zeros after; width a multiple of 4), ``lengths`` (n,).
    Returns uint32 (n,). Vectorised over the strings; one pass per 4-byte block.

    >>> int(murmur3_x86_32(np.frombuffer(b"abcd", np.uint8)[None], np.array([4]), 0x9747B28C)[0])
    4031219239
    """
    n, width = data.shape
    lengths = np.asarray(lengths, dtype=np.int64)
    words = np.ascontiguousarray(data).view("<u4").astype(np.uint32)     # (n, width // 4)
    h = np.full(n, np.uint32(seed & 0xFFFFFFFF), dtype=np.uint32)
    full = lengths // 4
    with np.errstate(over="ignore"):
        for b in range(width // 4):
            live = b < full
            if not live.any():
                break
            k = _mix_block(words[:, b])
            m = h ^ k
            m = _rotl(m, 13) * np.uint32(5) + np.uint32(0xE6546B64)
            h = np.where(live, m, h)
        rem = lengths & 3
        tail = words[np.arange(n), np.minimum(full, max(width // 4 - 1, 0))] if width else \
            np.zeros(n, np.uint32)
        mask = (np.uint64(1) << (8 * rem).astype(np.uint64)) - np.uint64(1)
        k = (tail.astype(np.uint64) & mask).astype(np.uint32)
        h = np.where(rem > 0, h ^ _mix_block(k), h)
        h ^= lengths.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def _as_bytes(X):
    """(data, lengths) of every element: a string's UTF-8 bytes, a number's own bytes."""
    flat = X.reshape(-1)
    if X.dtype.kind in "OUS":
        raw = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat]
        lengths = np.array([len(r) for r in raw], dtype=np.int64)
        width = int(-(-max(lengths.max(initial=0), 1) // 4) * 4)
        data = np.zeros((len(raw), width), dtype=np.uint8)
        for i, r in enumerate(raw):
            data[i, :len(r)] = np.frombuffer(r, dtype=np.uint8)
        return data, lengths
    item = X.dtype.itemsize
    data = np.ascontiguousarray(flat.astype(X.dtype.newbyteorder("<"))).view(np.uint8)
    return data.reshape(len(flat), item), np.full(len(flat), item, dtype=np.int64)


@kernel("MurmurHash3", since=1, domain=MS, host_shape_math=True)
def murmur_hash3(X, *, positive=1, seed=0):
    """The 32-bit MurmurHash3 (x86) of every element: strings hashed over their UTF-8 bytes,
    numbers over their little-endian bytes (4 for int32/uint32/float, 8 for int64/uint64/
    double); ``seed`` as an unsigned 32-bit value; uint32 out, or int32 (the same bits) when
    ``positive`` is 0."""
    op = "MurmurHash3"
    if X.dtype.kind not in "OUS" and X.dtype.name not in _HASHABLE:
        raise InputError(f"{op}: input of type {X.dtype} is not supported (uint32, int32, "
                         f"uint64, int64, float, double or string)")
    if not 0 <= int(seed) <= 0xFFFFFFFF and not -(2 ** 31) <= int(seed) < 0:
        raise InputError(f"{op}: seed {seed} is not a 32-bit value")
    if X.size == 0:
        return np.zeros(X.shape, np.uint32 if positive else np.int32)
    data, lengths = _as_bytes(np.asarray(X))
    h = murmur3_x86_32(data, lengths, int(seed) & 0xFFFFFFFF).reshape(X.shape)
    return h if positive else h.view(np.int32)
