"""The ONNX conformance yardstick.

Generates the official node test cases from the installed onnx package
(``onnx.backend.test.case.node.collect_testcases``), runs each through ``workbench.backend`` and
compares with the expected outputs the way onnx's own runner does (same rtol/atol, dtype and
shape equality). Prints passed/total overall and per operator::

    python -m workbench.conformance                 # everything, summary per op
    python -m workbench.conformance -k conv -v      # cases whose name contains "conv", details
    python -m workbench.conformance --failures      # one line per failing case with the reason
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import signal
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

EXPECTED_FAILURES_FILE = "tests/conformance_expected_failures.txt"


@dataclass
class CaseResult:
    name: str
    op: str
    ok: bool
    message: str = ""
    seconds: float = 0.0


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


# onnx generates its node cases by importing every module of onnx.backend.test.case.node
# (each runs its examples: about a minute, mostly the pooling ones). A full collection records
# which module makes which case (an index in the workbench cache, per onnx version and module
# set), so ``-k PATTERN`` later imports only the modules it needs.
_INDEX_FORMAT = 1


def _node_modules() -> list:
    """The modules onnx's ``collect_testcases`` imports, in its order (ai.onnx.ml ones only
    where onnx was built with them)."""
    import importlib
    import pkgutil

    from onnx.backend.test.case import node, utils

    out = []

    def walk(pkg):
        for _loader, name, ispkg in pkgutil.iter_modules(pkg.__path__):
            full = f"{pkg.__name__}.{name}"
            if not utils.ONNX_ML and full.startswith("onnx.backend.test.case.node.ai_onnx_ml"):
                continue
            out.append(full)
            if ispkg:
                walk(importlib.import_module(full))
    walk(node)
    return out


def _index_path() -> str:
    import hashlib
    import os

    from onnx.backend.test.case import node

    from workbench.files import cache_home
    folder = node.__path__[0]
    h = hashlib.sha256(onnx.__version__.encode())
    for root, _dirs, files in sorted(os.walk(folder)):
        for f in sorted(files):
            if f.endswith(".py"):
                st = os.stat(os.path.join(root, f))
                h.update(f"{os.path.relpath(os.path.join(root, f), folder)}:{st.st_size}".encode())
    return os.path.join(cache_home(create=False), "conformance",
                        f"onnx-{onnx.__version__}-{h.hexdigest()[:16]}.json")


def _import_all() -> dict:
    """Import every node-case module (what ``collect_testcases`` does); returns {case name:
    module that made it}."""
    import importlib

    from onnx.backend.test.case import node

    made = {}
    for mod in _node_modules():
        before = len(node._NodeTestCases)
        importlib.import_module(mod)
        for c in node._NodeTestCases[before:]:
            made.setdefault(c.name, mod)
    return made


def _write_index(made: dict) -> None:
    import json
    import os

    try:
        path = _index_path()
        if os.path.exists(path):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        from workbench.files import write_atomic
        data = json.dumps({"format": _INDEX_FORMAT, "onnx": onnx.__version__,
                           "cases": made}).encode()
        write_atomic(path, lambda f: f.write(data), overwrite=True)
    except Exception:  # noqa: BLE001 - a cache: a read-only home only costs time next run
        pass


def _read_index() -> dict | None:
    import json

    try:
        with open(_index_path(), encoding="utf-8") as f:
            data = json.load(f)
        return data["cases"] if data.get("format") == _INDEX_FORMAT else None
    except Exception:  # noqa: BLE001 - missing or unreadable: collect everything
        return None


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple:
    from onnx.backend.test.case import node
    fresh = not node._NodeTestCases           # no module imported yet: the index is whole
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = _import_all()
        cases = tuple(node.collect_testcases())    # (every module is imported already)
    if fresh and made:
        _write_index(made)
    return cases


def _some_cases(patterns) -> list | None:
    """The cases matching ``patterns`` (and the unexpanded twins of expanded ones, for their
    labels) from only the modules that make them, by the index; None without an index or
    when the modules no longer make what it says."""
    import importlib

    made = _read_index()
    if not made:
        return None
    names = {n for n in made if any(p in n for p in patterns)}
    names |= {_EXPANDED.sub("", n) for n in names} & set(made)
    from onnx.backend.test.case import node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in sorted({made[n] for n in names}):
            importlib.import_module(mod)
    have = {c.name: c for c in node._NodeTestCases}
    if not names <= set(have):
        return None
    return [have[n] for n in names]


_FEW: dict = {}    # the cases a filtered collection made (for primary_op's twins)


def _cases_by_name() -> dict:
    if _FEW and _all_cases.cache_info().currsize == 0:
        return _FEW
    return {c.name: c for c in _all_cases()}


def collect(patterns=None) -> list:
    """The node test cases of the installed onnx package, filtered by name substrings."""
    cases = None
    if patterns and _all_cases.cache_info().currsize == 0:
        few = _some_cases(patterns)
        if few is not None:
            _FEW.update({c.name: c for c in few})
            cases = few
    if cases is None:
        cases = list(_all_cases())
    if patterns:
        cases = [c for c in cases if any(p in c.name for p in patterns)]
    return sorted(cases, key=lambda c: c.name)


def primary_op(case) -> str:
    """The operator a case tests: the single op of one-node models, else from the case name.
    An expanded case (``test_x_expanded``: the op's function body in its place) is labelled
    with the op of its unexpanded twin (``test_x``) and "(expanded)"."""
    base = _EXPANDED.sub("", case.name)
    if base != case.name:
        twin = _cases_by_name().get(base)
        if twin is not None and not _EXPANDED.search(twin.name):
            return primary_op(twin) + " (expanded)"
    types = [n.op_type for n in case.model.graph.node if n.op_type != "Constant"]
    uniq = sorted(set(types))
    if len(uniq) == 1:
        return uniq[0]
    if not uniq:
        return "Constant"
    name = re.sub(r"^test_", "", case.name).lower()
    flat = name.replace("_", "")
    best = None
    for t in uniq:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", t).lower()
        if name.startswith(snake) or flat.startswith(t.lower()):
            if best is None or len(t) > len(best):
                best = t
    return (best or uniq[0]) + (" (expanded)" if base != case.name else "")


def _norm(x):
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def compare(ref_outputs, outputs, rtol: float, atol: float) -> None:
    """Raise AssertionError when outputs differ from the reference (onnx runner semantics)."""
    if len(outputs) != len(ref_outputs):
        raise AssertionError(f"{len(outputs)} outputs, expected {len(ref_outputs)}")
    for i, (ref, out) in enumerate(zip(ref_outputs, outputs)):
        if ref is None:
            if out is not None:
                raise AssertionError(f"output {i}: expected an empty optional, got {type(out)}")
            continue
        if isinstance(ref, (list, tuple)):
            if not isinstance(out, (list, tuple)):
                raise AssertionError(f"output {i}: expected a sequence, got {type(out).__name__}")
            if len(ref) != len(out):
                raise AssertionError(f"output {i}: sequence of {len(out)}, expected {len(ref)}")
            compare(list(ref), list(out), rtol, atol)
            continue
        if not isinstance(out, np.ndarray):
            raise AssertionError(f"output {i}: expected an array, got {type(out).__name__}")
        if tuple(out.shape) != tuple(ref.shape):
            raise AssertionError(f"output {i}: shape {list(out.shape)}, expected "
                                 f"{list(ref.shape)}")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref, err_msg=f"output {i}")
            continue
        if out.dtype != ref.dtype:
            raise AssertionError(f"output {i}: dtype {out.dtype}, expected {ref.dtype}")
        o_rtol = rtol
        if out.dtype.name == "bfloat16" or "float8" in out.dtype.name or \
                "float4" in out.dtype.name or out.dtype.name in ("int4", "uint4", "int2", "uint2"):
            if out.dtype.name == "bfloat16":
                o_rtol = max(rtol, 2 ** -6)
            out = out.astype(np.float32)
            ref = ref.astype(np.float32)
        np.testing.assert_allclose(out, ref, rtol=o_rtol, atol=atol, err_msg=f"output {i}")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_case(case, device: str = "CPU", timeout: int = 60) -> CaseResult:
    import workbench.backend as backend
    from workbench.ops.sequence_repr import from_engine

    op = primary_op(case)
    t0 = time.perf_counter()
    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = backend.prepare(case.model, device)
            for inputs, ref_outputs in case.data_sets:
                outs = rep.run([_norm(x) for x in inputs])
                compare([_norm(r) for r in ref_outputs], [from_engine(o) for o in outs],
                        case.rtol, case.atol)
        return CaseResult(case.name, op, True, "", time.perf_counter() - t0)
    except _Timeout:
        return CaseResult(case.name, op, False, f"timeout after {timeout}s",
                          time.perf_counter() - t0)
    except AssertionError as e:
        msg = " ".join(str(e).split())[:300]
        return CaseResult(case.name, op, False, "wrong result: " + msg, time.perf_counter() - t0)
    except Exception as e:
        msg = " ".join(str(e).split())[:300]
        return CaseResult(case.name, op, False, f"{type(e).__name__}: {msg}",
                          time.perf_counter() - t0)
    finally:
        if use_alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


def run_all(patterns=None, device: str = "CPU") -> list[CaseResult]:
    return [run_case(c, device) for c in collect(patterns)]


def load_expected_failures(path: str = EXPECTED_FAILURES_FILE) -> dict[str, str]:
    """{case name: reason} from the expected-failures file (``name  # reason`` per line)."""
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, _, reason = line.partition("#")
                out[name.strip()] = reason.strip()
    except FileNotFoundError:
        pass
    return out


def summarize(results: list[CaseResult], out=None, per_op: bool = True) -> None:
    out = out or sys.stdout
    by_op = collections.defaultdict(list)
    for r in results:
        by_op[r.op].append(r)
    if per_op:
        print(f"{'operator':34s} {'passed':>7s} {'total':>6s}", file=out)
        for op in sorted(by_op):
            rs = by_op[op]
            p = sum(r.ok for r in rs)
            mark = "" if p == len(rs) else "  <"
            print(f"{op:34s} {p:7d} {len(rs):6d}{mark}", file=out)
    passed = sum(r.ok for r in results)
    print(f"\nONNX node conformance (onnx {onnx.__version__}): {passed}/{len(results)} cases pass "
          f"({len(by_op)} operators, {sum(all(r.ok for r in rs) for rs in by_op.values())} "
          f"fully passing)", file=out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m workbench.conformance`` and ``workbench conformance``."""
    p.add_argument("-k", action="append", default=[], metavar="PATTERN",
                   help="only cases whose name contains this (repeat for several)")
    p.add_argument("--device", default="CPU", help="CPU (default) or CUDA:0")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every case as it runs: PASS/FAIL, seconds, the reason")
    p.add_argument("--failures", action="store_true", help="print each failing case and reason")
    p.add_argument("--no-per-op", action="store_true", help="leave out the per-operator table")
    p.add_argument("--write-expected", metavar="FILE",
                   help="write the failing cases as an expected-failures file")


def run(args) -> int:
    """Run the cases ``args`` select (options of :func:`add_arguments`); prints as it goes."""
    results = []
    for c in collect(args.k):
        r = run_case(c, args.device)
        results.append(r)
        if args.verbose:
            print(f"{'PASS' if r.ok else 'FAIL'} {r.name} [{r.op}] ({r.seconds:.2f}s) "
                  f"{r.message}".rstrip(), flush=True)
    if args.failures and not args.verbose:
        for r in results:
            if not r.ok:
                print(f"FAIL {r.name}: {r.message}")
    summarize(results, per_op=not args.no_per_op)
    if args.write_expected:
        with open(args.write_expected, "w", encoding="utf-8") as f:
            f.write("# ONNX node conformance cases expected to fail: name  # reason\n")
            for r in results:
                if not r.ok:
                    f.write(f"{r.name}  # {r.message}\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
