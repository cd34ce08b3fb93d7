"""Digests that check an answer without storing it: exact values and tolerance buckets.

**Exact values** (numbers compared exactly, strings, lists, dicts) are put in one canonical
form (:func:`normalize`) and hashed with SHA-256 and the exercise's salt.

**Numbers and arrays with a tolerance** are hashed element by element after rounding each
value onto a grid whose spacing is the tolerance at that value, ``atol + rtol * |x|``: the
grid coordinate is ``u = sign(x) * log1p(|x| / (atol / rtol)) / rtol`` (``x / atol`` when
``rtol == 0``), whose step of 1 is exactly that spacing. The reference stores
``h(round(u_ref))``; an answer element passes when ``h(round(u) + d)`` equals it for some
``d`` in ``{-1, 0, 1}``. So a value within the tolerance of the reference **always** passes,
one more than twice the tolerance away **never** does, and in between either can happen (a
bucket edge). Two coarser grids (10x and 100x the tolerance) tell "close" from "far off"
without saying which way. Integers, booleans and strings are compared exactly
(``d = 0``). ``h`` mixes the grid index with the element's position and the salt
(splitmix64, 32 bits kept), so equal values at different places give different digests.

What this hides: the reference values cannot be *read* from the stored digests, and the
digests of one course do not help with another (salt). What it does not hide: a digest is a
test anyone can run, so a student who writes a search loop over candidate answers (easy for a
yes/no question or a small integer, slow for a float array) finds the answer; and whatever
the notebook shows in the clear (shapes, dtypes, case inputs, the norm used in feedback) is
readable. See ``docs/classroom.md``.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from workbench.classroom.encoding import ClassroomError

LEVELS = 3                 # tolerance, 10x, 100x
SAMPLE_LIMIT = 65_536      # array elements digested at most (a fixed, seeded sample beyond)
# special grid indices, far from each other and from the clipped finite range (+-2**62)
_NAN = np.int64(-(2**63) + 100)
_POS_INF = np.int64(2**63 - 100)
_NEG_INF = np.int64(-(2**63) + 200)
_CLIP = float(2**62)
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), \
    np.uint64(0x9E3779B97F4A7C15)
_POS_MIX = np.uint64(0xD6E8FEB86659FD93)


# ----------------------------------------------------------------------------- exact values
def normalize(value, *, ordered: bool = True, case_sensitive: bool = True,
              strip: bool = True):
    """The canonical form of an exact answer: Python scalars, lists, str-keyed dicts.

    numpy scalars and arrays become Python numbers and (nested) lists; tuples become lists
    (a tuple and a list with the same items are the same answer); sets become sorted lists;
    floats with an integral value become ints (``2.0`` is ``2``); strings are stripped and,
    unless ``case_sensitive``, lower-cased; with ``ordered=False`` a list's order is
    ignored. Anything else (an object, a function, a NaN) raises ClassroomError."""
    def norm(v):
        if v is None or isinstance(v, (bool, np.bool_)):
            return None if v is None else bool(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            if not math.isfinite(f):
                raise ClassroomError(f"{f} cannot be compared exactly")
            return int(f) if f.is_integer() and abs(f) < 2**53 else f
        if isinstance(v, str):
            s = v.strip() if strip else v
            return s if case_sensitive else s.lower()
        if isinstance(v, bytes):
            return norm(v.decode("utf-8", errors="replace"))
        if isinstance(v, np.ndarray):
            return norm(v.tolist())
        if isinstance(v, (list, tuple)):
            items = [norm(x) for x in v]
            return items if ordered else sorted(items, key=canonical)
        if isinstance(v, (set, frozenset)):
            return sorted((norm(x) for x in v), key=canonical)
        if isinstance(v, dict):
            return {str(norm(k)): norm(x) for k, x in v.items()}
        raise ClassroomError(f"a {type(v).__name__} cannot be compared as a value; give "
                             f"a number, a string, a bool, None, or a list/tuple/dict of these")
    return norm(value)


def canonical(v) -> str:
    """The canonical JSON text of a normalized value (what is hashed)."""
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def category(v) -> str:
    """The kind of a normalized value, for feedback ("expected a string, got a number")."""
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "list"
    return "dict"


def value_digest(salt: str, v) -> str:
    """Salted SHA-256 of a normalized value (hex, 32 characters kept)."""
    h = hashlib.sha256(f"{salt}\x00{canonical(v)}".encode())
    return h.hexdigest()[:32]


# ----------------------------------------------------------------------------- arrays
def salt64(salt: str) -> np.uint64:
    return np.uint64(int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "little"))


def _mix(q: np.ndarray, pos: np.ndarray, salt: np.uint64) -> np.ndarray:
    """splitmix64 of (grid index, position, salt), top 32 bits."""
    with np.errstate(over="ignore"):
        z = q.view(np.uint64) ^ salt ^ (pos.astype(np.uint64) * _POS_MIX)
        z = z + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(32)).astype(np.uint32)


def is_exact_dtype(dtype) -> bool:
    return np.dtype(dtype).kind in "biuUS"


def grid(a: np.ndarray, atol: float, rtol: float, level: int = 0) -> np.ndarray:
    """Grid indices (int64) of the values of ``a`` (see the module docstring)."""
    if a.dtype.kind in "US":
        return np.array([int.from_bytes(hashlib.sha256(str(s).encode()).digest()[:8],
                                        "little", signed=True) for s in a.ravel()],
                        dtype=np.int64)
    if a.dtype.kind in "biu":
        return a.astype(np.int64, copy=False).ravel()
    x = a.astype(np.float64, copy=False).ravel()
    scale = 10.0 ** level
    at, rt = atol * scale, rtol * scale
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if rt > 0:
            c = at / rt if at > 0 else 1e-30
            u = np.sign(x) * np.log1p(np.abs(x) / c) / rt
        else:
            u = x / at
        q = np.floor(np.clip(u, -_CLIP, _CLIP) + 0.5).astype(np.int64)
    q[np.isnan(x)] = _NAN
    q[np.isposinf(x)] = _POS_INF
    q[np.isneginf(x)] = _NEG_INF
    return q


def sample_positions(size: int, limit: int, salt: str) -> np.ndarray | None:
    """None (every element) when ``size <= limit``, else ``limit`` sorted flat indices
    drawn with a seed from the salt (the same on every machine)."""
    if size <= limit:
        return None
    rng = np.random.default_rng(int(salt64(salt)))
    return np.sort(rng.choice(size, size=limit, replace=False)).astype(np.int64)


def array_digest(a: np.ndarray, salt: str, *, atol: float, rtol: float,
                 limit: int = SAMPLE_LIMIT, levels: int = LEVELS) -> dict:
    """What the check stores of a reference array: shape, dtype, the (sampled) positions
    and one uint32 digest per element and grid level (base64)."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        raise ClassroomError("an array of Python objects cannot be a reference answer")
    pos = sample_positions(a.size, limit, salt)
    flat = a.ravel() if pos is None else a.ravel()[pos]
    idx = np.arange(a.size, dtype=np.int64) if pos is None else pos
    exact = is_exact_dtype(a.dtype)
    s = salt64(salt)
    digs = []
    for level in range(1 if exact else levels):
        q = grid(flat, atol, rtol, level)
        digs.append(_mix(q, idx, s))
    out = {"shape": list(a.shape), "dtype": str(a.dtype), "exact": exact,
           "atol": float(atol), "rtol": float(rtol),
           "digests": [d.tobytes().hex() for d in digs]}
    if pos is not None:
        out["positions"] = pos.tobytes().hex()
    return out


def _digests_of(data: dict) -> tuple[list, np.ndarray | None]:
    digs = [np.frombuffer(bytes.fromhex(h), dtype=np.uint32) for h in data["digests"]]
    pos = data.get("positions")
    pos = None if pos is None else np.frombuffer(bytes.fromhex(pos), dtype=np.int64)
    return digs, pos


def match_levels(a: np.ndarray, data: dict, salt: str) -> np.ndarray:
    """Per stored element of an answer with the reference's shape: the first grid level at
    which it matches (0 = within tolerance, 1 = within ~10x, 2 = within ~100x), or
    ``LEVELS`` (no match). Caller checks the shape first."""
    digs, pos = _digests_of(data)
    flat = np.asarray(a).ravel()
    idx = np.arange(flat.size, dtype=np.int64) if pos is None else pos
    if pos is not None:
        flat = flat[pos]
    s = salt64(salt)
    exact = bool(data.get("exact"))
    if exact and not is_exact_dtype(flat.dtype):
        # a float answer to an integer question: whole numbers compare, the rest do not
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(flat) & (flat == np.round(flat))
        flat = np.where(whole, flat, 0).astype(np.int64)
        ok_mask = whole
    elif not exact and flat.dtype.kind in "US":
        return np.full(flat.size, LEVELS, dtype=np.int8)
    else:
        ok_mask = np.ones(flat.size, dtype=bool)
    best = np.full(flat.size, LEVELS, dtype=np.int8)
    window = (0,) if exact else (-1, 0, 1)
    for level, ref in enumerate(digs):
        q = grid(flat, data["atol"], data["rtol"], level)
        hit = np.zeros(flat.size, dtype=bool)
        for d in window:
            with np.errstate(over="ignore"):
                hit |= _mix(q + np.int64(d), idx, s) == ref
        hit &= ok_mask
        best = np.where(hit & (best == LEVELS), level, best).astype(np.int8)
    return best


def sampled_count(data: dict) -> int:
    return len(bytes.fromhex(data["digests"][0])) // 4


def positions(data: dict, size: int) -> np.ndarray:
    pos = data.get("positions")
    return np.arange(size) if pos is None else np.frombuffer(bytes.fromhex(pos), np.int64)
