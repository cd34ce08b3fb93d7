"""com.microsoft::Tokenizer (since 1), from onnxruntime's ContribOperators specification:
what skl2onnx writes for CountVectorizer / TfidfVectorizer.

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
