"""The ``workbench`` command line.

    workbench info MODEL [--saturation [--input NAME=FILE.npy ...]]
                                              inputs/outputs, opsets, op histogram, parameters,
                                              which ops the engine lacks; where a quantized
                                              model's products saturate on x86 without VNNI
    workbench run MODEL [--input NAME=FILE.npy ...] [--compare onnxruntime] [--repeat N]
                        [--integer-arithmetic exact|saturating-u8s8]
    workbench demo                            the main job: the embedded default model, offline
    workbench view MODEL                      open the model in Netron (needs the netron package)
    workbench conformance [-k PATTERN]        the ONNX node conformance yardstick
    workbench profile MODEL --shape NAME=1,3,224,224 [--csv OUT.csv] [--markdown] [--ort]
                                              per-node FLOPs, parameters, bytes, roofline
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import traceback

import numpy as np

from workbench.errors import WorkbenchError


def _shape_str(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _dtype_str(info) -> str:
    from workbench.arrays.dtypes import dtype_name
    if info.dtype:
        return dtype_name(info.dtype)
    if info.type_proto is not None and not info.is_tensor:
        from workbench.graph.values import type_str  # seq(map(string, tensor(float))), ...
        return type_str(info.type_proto)
    return "?"


def describe(loaded, out=None) -> dict:
    """Print a model's summary; returns the facts as a dict (for tests and widgets)."""
    out = out or sys.stdout
    from workbench.ops.registry import has_kernel
    g = loaded.graph
    p = loaded.proto
    hist = collections.Counter()
    missing = collections.Counter()

    def walk(graph):
        for n in graph.nodes:
            key = n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}::{n.op_type}"
            hist[key] += 1
            if not has_kernel(n.op_type, n.domain, g.opsets.get(n.domain or "", None)):
                missing[key] += 1
            for sg in n.subgraphs:
                walk(sg)

    walk(g)
    from workbench.analysis.weights import weight_summary
    w = weight_summary(g)   # initializers and Constant-held weights, each counted once
    n_params = w["parameters"]
    print(f"model: {loaded.path or '(in memory)'}", file=out)
    print(f"  producer: {p.producer_name} {p.producer_version}".rstrip(), file=out)
    print(f"  IR version: {p.ir_version}; opsets: " + ", ".join(
        f"{d or 'ai.onnx'} {v}" for d, v in sorted(g.opsets.items())), file=out)
    if p.doc_string:
        print(f"  doc: {p.doc_string.strip()[:200]}", file=out)
    print("inputs:", file=out)
    for v in g.inputs:
        print(f"  {v.name}: {_dtype_str(v)} {_shape_str(v.shape)}", file=out)
    print("outputs:", file=out)
    for v in g.outputs:
        print(f"  {v.name}: {_dtype_str(v)} {_shape_str(v.shape)}", file=out)
    buffers = f" + {w['buffers']:,} in buffers (running statistics)" if w["buffers"] else ""
    if not w["n_constants"] and not w["n_computed"]:
        where = f" in {w['n_initializers']} initializer(s)"
    else:   # weights held by Constant nodes (paddle2onnx) or made from constants at run time
        where = f": {w['in_initializers']:,} in {w['n_initializers']} initializer(s)"
        if w["n_constants"]:
            where += f", {w['in_constants']:,} in {w['n_constants']} Constant node(s)"
        if w["n_computed"]:
            where += (f", {w['computed']:,} computed from constants by {w['n_computed']} "
                      f"node(s)")
    print(f"nodes: {sum(hist.values())} ({len(hist)} op types); parameters: {n_params:,}"
          f"{buffers}{where}", file=out)
    for op, c in hist.most_common():
        flag = "   <- no kernel" if op in missing else ""
        print(f"  {op:28s} {c:6d}{flag}", file=out)
    domains = _domain_support(hist, missing, g.opsets)
    print("support per domain:", file=out)
    for dom, d in domains.items():
        opset = "opset ?" if d["opset"] is None else f"opset {d['opset']}"
        print(f"  {dom} ({opset}): {len(d['supported'])} op type(s) with kernels, "
              f"{len(d['missing'])} missing" + (f": {', '.join(d['missing'])}"
                                               if d["missing"] else ""), file=out)
    if missing:
        print(f"the engine lacks {len(missing)} op type(s): {', '.join(sorted(missing))}",
              file=out)
    else:
        print("the engine has kernels for every op in this model", file=out)
    notes = list(getattr(loaded, "notes", []) or [])
    if notes:
        print("load notes:", file=out)
        for note in notes:
            print(f"  - {note}", file=out)
    return {"histogram": dict(hist), "missing": dict(missing), "parameters": n_params,
            "domains": domains, "notes": notes}


def _domain_support(hist, missing, opsets) -> dict:
    """{domain: {"opset", "supported": [op types], "missing": [op types]}} for the domains
    the model's nodes use (ai.onnx written as "ai.onnx")."""
    out: dict = {}
    for key in hist:
        dom, op = key.split("::", 1) if "::" in key else ("", key)
        d = out.setdefault(dom or "ai.onnx", {"opset": opsets.get(dom), "supported": [],
                                             "missing": []})
        d["missing" if key in missing else "supported"].append(op)
    for d in out.values():
        d["supported"].sort()
        d["missing"].sort()
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "ai.onnx", kv[0])))


def _random_inputs(graph, seed: int = 0) -> dict:
    from workbench.arrays.dtypes import np_dtype_of_onnx
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        shape = [d if isinstance(d, int) else 1 for d in (v.shape or ())]
        dt = np_dtype_of_onnx(v.dtype or 1)
        if dt.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            feeds[v.name] = rng.integers(0, 2, shape).astype(dt)
        elif dt.kind == "b":
            feeds[v.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise WorkbenchError(f"cannot make a random value for input {v.name!r} of type "
                                 f"{dt}; give it with --input {v.name}=FILE.npy")
    return feeds


def _load_inputs(specs, graph) -> tuple[dict, list]:
    feeds = _random_inputs(graph) if len(specs) < len(graph.inputs) else {}
    notes = []
    names = [v.name for v in graph.inputs]
    for spec in specs:
        if "=" not in spec:
            raise WorkbenchError(f"--input {spec!r}: expected NAME=FILE.npy")
        name, path = spec.split("=", 1)
        if name not in names:
            raise WorkbenchError(f"--input {spec!r}: the model has no input {name!r} "
                                 f"(its inputs are {names})")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise WorkbenchError(f"--input {spec!r}: file {path!r} not found") from None
        except ValueError as e:
            raise WorkbenchError(f"--input {spec!r}: {path!r} is not a plain .npy array ({e})"
                                 ) from None
    given = {s.split("=", 1)[0] for s in specs}
    for n in names:
        if n not in given:
            notes.append(f"input {n!r}: random values of shape {list(feeds[n].shape)} "
                         f"(symbolic dims set to 1)")
    return feeds, notes


def _time(fn, repeat: int) -> tuple[float, object]:
    out = fn()
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def cmd_info(args) -> int:
    from workbench.graph.load import load
    loaded = load(args.model, check=not args.no_check)
    describe(loaded)
    if args.saturation:
        from workbench.quantization import onnxruntime_optimized_model, saturation_report
        feeds, notes = _load_inputs(args.input or [], loaded.graph)
        note = ("random calibration inputs (" + "; ".join(notes) + "): give real ones with "
                "--input NAME=FILE.npy") if notes else "the inputs given"
        report = saturation_report(loaded.proto, feeds, inputs_note=note)
        print()
        print(report.table())
        if report.qdq_nodes and _has_onnxruntime():
            print("\nthe same for onnxruntime's optimized form of the model (its QDQ groups "
                  "fused into integer operators):")
            print(saturation_report(onnxruntime_optimized_model(loaded.proto), feeds,
                                    inputs_note=note).table())
    elif args.input:
        raise WorkbenchError("--input is used with --saturation (workbench info MODEL "
                             "--saturation --input NAME=FILE.npy)")
    return 0


def cmd_run(args) -> int:
    import workbench.backend as backend
    rep = backend.prepare(args.model, args.device, check=not args.no_check,
                          integer_arithmetic=args.integer_arithmetic)
    graph = rep.loaded.graph
    if args.integer_arithmetic != "exact":
        print(f"note: integer products computed as '{args.integer_arithmetic}' (onnxruntime's "
              f"arithmetic on x86 CPUs without VNNI), not exactly as the ONNX spec says")
    feeds, notes = _load_inputs(args.input or [], graph)
    for n in notes:
        print("note:", n)
    t, outs = _time(lambda: rep.run(feeds), args.repeat)
    print(f"workbench ({args.device}): {t * 1e3:.2f} ms per run (median of {args.repeat})")
    for name, o in zip(rep.output_names, outs):
        a = np.asarray(o) if not isinstance(o, list) else o
        if isinstance(a, np.ndarray):
            flat = a.reshape(-1)[:6]
            first = np.array2string(flat, precision=4)
            print(f"  {name}: {a.dtype} {list(a.shape)} first values {first}")
        else:
            print(f"  {name}: sequence of {len(a)}")
    if args.save:
        np.savez(args.save, **{n: np.asarray(o) for n, o in zip(rep.output_names, outs)})
        print("saved outputs to", args.save)
    if args.compare:
        if args.compare != "onnxruntime":
            raise WorkbenchError(f"--compare {args.compare!r}: only 'onnxruntime' is supported")
        try:
            import onnxruntime as ort
        except ImportError:
            raise WorkbenchError("--compare onnxruntime needs the onnxruntime package "
                                 "(pip install onnxruntime)") from None
        sess = ort.InferenceSession(rep.loaded.proto.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        t2, ref = _time(lambda: sess.run(None, feeds), args.repeat)
        print(f"onnxruntime {ort.__version__}: {t2 * 1e3:.2f} ms per run; "
              f"workbench/onnxruntime time ratio {t / t2:.2f}")
        worst = _print_differences(rep.output_names, outs, ref)
        if worst > 1e-3:
            if _explain_saturation(args, feeds, ref, worst):
                return 0
            print("warning: outputs differ from onnxruntime by more than 1e-3 (normalised)")
            return 1
    return 0


def _print_differences(names, outs, ref, quiet: bool = False) -> float:
    """Print each output's difference from onnxruntime's; the worst, normalised (1 for a
    differing integer output)."""
    worst = 0.0
    for name, o, r in zip(names, outs, ref):
        o, r = _comparable(o), _comparable(r)
        if o.dtype.kind in "fc":
            diff = float(np.max(np.abs(o.astype(np.float64) - r))) if o.size else 0.0
            scale = float(np.max(np.abs(r))) if r.size else 0.0
            norm = diff / max(scale, 1e-12)
            worst = max(worst, norm)
            if not quiet:
                print(f"  {name}: max abs difference {diff:.3g} (normalised {norm:.3g})")
        else:
            same = o.shape == r.shape and bool(np.all(o == r))
            if not quiet:
                print(f"  {name}: {'identical' if same else 'DIFFERENT'}")
            worst = max(worst, 0.0 if same else 1.0)
    return worst


def _has_onnxruntime() -> bool:
    import importlib.util
    return importlib.util.find_spec("onnxruntime") is not None


def _explain_saturation(args, feeds, ref, worst: float) -> bool:
    """When the engine ran the spec's exact integer arithmetic and onnxruntime's saturating
    u8 x s8 arithmetic (x86 without VNNI) reproduces onnxruntime, say so in one line. A QDQ
    model is tried in onnxruntime's optimized form (its QDQ groups fused into integer
    operators, as onnxruntime runs it)."""
    if args.integer_arithmetic != "exact":
        return False
    import workbench.backend as backend
    from workbench.graph import passes
    from workbench.quantization import (
        ADVICE,
        SATURATING_U8S8,
        onnxruntime_arithmetic,
        onnxruntime_optimized_model,
        qdq_product_nodes,
    )
    if onnxruntime_arithmetic() is not SATURATING_U8S8:
        return False
    rep = backend.prepare(args.model, args.device, check=not args.no_check,
                          integer_arithmetic=SATURATING_U8S8)
    how = "with --integer-arithmetic saturating-u8s8"
    if not passes.integer_product_nodes(rep.loaded.graph):
        if not qdq_product_nodes(rep.loaded.graph):
            return False
        rep = backend.prepare(onnxruntime_optimized_model(rep.loaded.proto), args.device,
                              check=not args.no_check, integer_arithmetic=SATURATING_U8S8)
        how = ("on onnxruntime's optimized form of this QDQ model (its Conv/MatMul/Gemm "
               "fused into integer operators) with --integer-arithmetic saturating-u8s8")
    sat = _print_differences(rep.output_names, rep.run(feeds), ref, quiet=True)
    if sat > 1e-3 and sat > worst / 10:
        return False
    print(f"note: onnxruntime on this CPU (x86 without VNNI) adds uint8 x int8 products in "
          f"pairs saturated to int16; the engine follows the ONNX spec (exact). {how[0].upper()}"
          f"{how[1:]} the worst normalised difference is {sat:.3g} (was {worst:.3g}); {ADVICE} "
          f"(workbench info MODEL --saturation shows where)")
    return True


def _comparable(v) -> np.ndarray:
    """An output as an array: a sequence of maps (ZipMap) becomes its keys row and values."""
    if isinstance(v, list) and v and isinstance(v[0], dict):
        keys = list(v[0])
        if all(list(d) == keys for d in v):
            return np.array([[d[k] for k in keys] for d in v], dtype=np.float64)
        return np.array([repr(d) for d in v], dtype=object)
    return np.asarray(v)


def default_model_path() -> str:
    return os.path.join(os.path.dirname(__file__), "data", "default_model.onnx")


def cmd_demo(args) -> int:
    """The main job: load the embedded digits CNN, describe it, classify held-out digits."""
    import workbench.backend as backend
    from workbench.graph.load import load
    path = default_model_path()
    print("ONNX Workbench demo: the embedded default model (a digits CNN), offline\n")
    loaded = load(path)
    describe(loaded)
    sample = np.load(os.path.join(os.path.dirname(path), "digits_sample.npz"),
                     allow_pickle=False)
    images, labels = sample["images"], sample["labels"]
    rep = backend.prepare(path)
    print(f"\noptimised plan: {len(rep.plan.steps)} steps (from {len(loaded.graph.nodes)} nodes"
          f" after constant folding, BatchNorm folding, Identity/Dropout removal and "
          f"Conv+activation fusion)")
    t, (logits,) = _time(lambda: rep.run([images]), 20)
    pred = logits.argmax(1)
    acc = float((pred == labels).mean())
    print(f"\nclassified {len(images)} held-out 8x8 digits in {t * 1e3:.2f} ms: "
          f"accuracy {acc:.3f}")
    for i in range(min(8, len(images))):
        img = images[i, 0]
        rows = ["".join(" .:-=+*#%@"[min(9, int(v * 9.99))] for v in row) for row in img]
        print(f"  label {labels[i]}  predicted {pred[i]}   |{rows[2]}|")
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"image": images})[0]
        err = float(np.max(np.abs(ref - logits)) / max(np.max(np.abs(ref)), 1e-12))
        print(f"\ncross-check with onnxruntime {ort.__version__}: normalised max difference "
              f"{err:.2e}")
    except ImportError:
        print("\n(onnxruntime is not installed: skipping the cross-check)")
    return 0 if acc > 0.9 else 1


def cmd_view(args) -> int:
    try:
        from workbench.widgets.netron_view import view_main
    except ImportError as e:
        raise WorkbenchError(f"workbench view needs the widgets extra ({e}); "
                             f"pip install 'onnx-workbench[lab]'") from None
    return view_main([args.model] + args.rest)


def cmd_conformance(args) -> int:
    from workbench import conformance
    argv = []
    for k in args.k or []:
        argv += ["-k", k]
    if args.failures:
        argv.append("--failures")
    return conformance.main(argv)


# ---------------------------------------------------------------------------- profile
def _shape_args(specs, what: str, single_input: str | None = None) -> dict:
    """``NAME=1,3,224,224`` (or just ``1,3,224,224`` for a one-input model) -> {NAME: dims}."""
    from workbench.analysis.shapes import parse_shape
    out = {}
    for spec in specs or []:
        name, eq, dims = spec.rpartition("=")
        if not eq:
            if what != "--shape" or single_input is None:
                raise WorkbenchError(f"{what} {spec!r}: expected NAME=VALUE")
            name, dims = single_input, spec
        if what == "--dim":
            try:
                out[name] = int(dims)
            except ValueError:
                raise WorkbenchError(f"--dim {spec!r}: the size must be an integer") from None
        else:
            out[name] = parse_shape(dims)
    return out


def cmd_profile(args) -> int:
    from workbench.analysis import analyze, markdown_table
    from workbench.analysis.analysis import MARKDOWN_COLUMNS
    from workbench.graph.load import load
    pre = load(args.model, check=not args.no_check, shape_inference=False)
    single = pre.graph.inputs[0].name if len(pre.graph.inputs) == 1 else None
    a = analyze(pre, _shape_args(args.shape, "--shape", single),
                dims=_shape_args(args.dim, "--dim"), default_dim=args.default_dim,
                optimized=args.optimized)
    a.label = args.model
    if args.roofline or args.ort:
        a.roofline(recalibrate=args.recalibrate)
    if args.ort:
        a.profile_ort(runs=args.ort_runs)
    print(a.summary())
    groups = a.groups(args.group_depth)
    rows = groups.to_dict("records") if hasattr(groups, "to_dict") else groups
    rows.sort(key=lambda r: -(r["flops"] or 0))
    cols = ["group", "nodes", "macs", "flops", "params", "bytes_read", "bytes_written"]
    if args.ort:
        cols.append("time_ort_ms")
    print(f"\nper group (name scope, depth {args.group_depth}), by FLOPs:")
    print(markdown_table(rows[:args.top], cols))
    if args.markdown:
        print("\nevery node:")
        print(a.to_markdown())
    else:
        key = "time_ort_ms" if args.ort else "flops"
        hide = () if args.ort else ("time_ort_ms", "pct_of_roof") if args.roofline else (
            "bound", "time_ort_ms", "pct_of_roof")
        cols = [c for c in MARKDOWN_COLUMNS if c not in hide]
        print(f"\ntop {args.top} nodes by {key} (--markdown for all):")
        print(a.to_markdown(cols, top=args.top, sort=key))
    if args.csv:
        a.to_csv(args.csv, overwrite=args.force)
        print(f"\nwrote {len(a.records)} rows to {args.csv}")
    return 0


def _add_profile_parser(sub) -> None:
    pr = sub.add_parser("profile", help="per-node FLOPs, parameters, bytes and roofline")
    pr.add_argument("model")
    pr.add_argument("--shape", action="append", metavar="NAME=1,3,224,224",
                    help="an input's shape (repeat per input; NAME= may be left out for a "
                         "one-input model)")
    pr.add_argument("--dim", action="append", metavar="SYMBOL=N",
                    help="the size of a symbolic dim, e.g. --dim batch=1 --dim seq=128")
    pr.add_argument("--default-dim", type=int, metavar="N",
                    help="size for every dim left unbound (otherwise they are an error)")
    pr.add_argument("--optimized", action="store_true",
                    help="analyse the graph the engine runs (folded, fused)")
    pr.add_argument("--top", type=int, default=15, help="rows in the top tables")
    pr.add_argument("--group-depth", type=int, default=1, help="scope depth of the groups")
    pr.add_argument("--markdown", action="store_true", help="print every node (Markdown)")
    pr.add_argument("--csv", metavar="OUT.csv", help="write the per-node table as CSV")
    pr.add_argument("--force", action="store_true", help="overwrite an existing --csv file")
    pr.add_argument("--roofline", action="store_true",
                    help="place nodes on this machine's roofline (peaks measured once, cached)")
    pr.add_argument("--recalibrate", action="store_true", help="measure the peaks again")
    pr.add_argument("--ort", action="store_true",
                    help="onnxruntime's per-kernel times mapped onto the nodes (implies "
                         "--roofline; needs onnxruntime)")
    pr.add_argument("--ort-runs", type=int, default=10)
    pr.add_argument("--no-check", action="store_true", help="skip onnx.checker")
    pr.set_defaults(func=cmd_profile)


# --------------------------------------------------------------------------- classroom (issue 27)
def cmd_assign(args) -> int:
    from workbench.classroom import assign
    for nb in args.notebooks:
        print(assign(nb, args.out, files=args.file or (), overwrite=args.overwrite,
                     timeout=args.timeout))
    return 0


def cmd_grade(args) -> int:
    from workbench.classroom.grading import Limits, grade
    limits = Limits(timeout=args.timeout, cpu=args.cpu, memory=args.memory)
    rep = grade(args.submissions, args.key, args.out, limits=limits, jobs=args.jobs,
                hide=args.hide or (), overwrite=args.overwrite,
                isolation="required" if args.require_isolation else "auto")
    print(rep)
    return 0


def add_classroom_parsers(sub) -> None:
    a = sub.add_parser("assign", help="instructor notebook -> students' notebook + answer key")
    a.add_argument("notebooks", nargs="+", metavar="INSTRUCTOR.ipynb")
    a.add_argument("--out", required=True, help="folder for the students' notebooks and keys")
    a.add_argument("--file", action="append", metavar="PATH",
                   help="a file the notebook reads (relative to it), handed out with it")
    a.add_argument("--overwrite", action="store_true")
    a.add_argument("--timeout", type=float, default=900,
                   help="seconds the instructor's notebook may take to run (default 900)")
    a.set_defaults(func=cmd_assign)
    g = sub.add_parser("grade", help="grade a folder of submitted notebooks in a sandbox")
    g.add_argument("submissions", help="folder of <student>.ipynb or <student>/<notebook>")
    g.add_argument("--key", required=True, help="the answer key from `workbench assign`")
    g.add_argument("--out", required=True, help="folder for grades.csv and feedback/")
    g.add_argument("--timeout", type=float, default=300, help="wall seconds per notebook")
    g.add_argument("--cpu", type=float, help="CPU seconds per notebook (default: --timeout)")
    g.add_argument("--memory", default="4GiB", help="memory per notebook (default 4GiB)")
    g.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    g.add_argument("--hide", action="append", metavar="DIR",
                   help="another folder the notebooks must not see")
    g.add_argument("--require-isolation", action="store_true",
                   help="refuse to grade where namespaces are not available")
    g.add_argument("--overwrite", action="store_true")
    g.set_defaults(func=cmd_grade)

def cmd_warmup(args) -> int:
    from workbench import compiled
    if args.status:
        st = compiled.status()
        print(f"compiled kernels: {'on' if st['enabled'] else 'off (WORKBENCH_COMPILED)'}; "
              f"cache {st['folder']}")
        for m, info in st["modules"].items():
            extra = f": {info['why']}" if info.get("why") else ""
            print(f"  {m}: {info['state']}{extra}")
        return 0
    why = compiled.can_build()
    if why:
        raise WorkbenchError(f"cannot compile kernels here: {why}")
    from workbench.compiled import cache
    mods = args.modules or compiled.modules()
    print(f"compiling {len(mods)} kernel module(s) for this CPU into {cache.cache_dir()} "
          f"(once per machine and engine version; runs use numpy meanwhile)", flush=True)
    report = compiled.warmup(mods, force=args.force,
                             progress=lambda line: print(line, flush=True))
    bad = {m: r for m, r in report["modules"].items() if not r["ok"]}
    print(f"done in {report['seconds']:.1f} s: {len(mods) - len(bad)} module(s) ready, "
          f"{len(bad)} failed")
    for m, r in bad.items():
        print(f"  {m}: {r['error']}", file=sys.stderr)
    return 1 if bad else 0


def _add_warmup_parser(sub) -> None:
    w = sub.add_parser("warmup", help="compile the engine's CPU kernels now (else they are "
                                      "compiled in the background on first use)")
    w.add_argument("modules", nargs="*", help="kernel modules (default: all)")
    w.add_argument("--force", action="store_true", help="rebuild even if cached")
    w.add_argument("--status", action="store_true", help="only say where each module stands")
    w.set_defaults(func=cmd_warmup)



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="ONNX Workbench command line")
    p.add_argument("--debug", action="store_true",
                   help="print the full traceback of an error (also WORKBENCH_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("info", help="describe a model")
    a.add_argument("model")
    a.add_argument("--no-check", action="store_true", help="skip onnx.checker")
    a.add_argument("--saturation", action="store_true",
                   help="report where the model's uint8 x int8 products would saturate on x86 "
                        "CPUs without VNNI (onnxruntime's arithmetic there), on the --input "
                        "files or random inputs")
    a.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="calibration input for --saturation (random values otherwise)")
    a.set_defaults(func=cmd_info)
    r = sub.add_parser("run", help="run a model (random inputs unless given)")
    r.add_argument("model")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--compare", metavar="onnxruntime")
    r.add_argument("--repeat", type=int, default=5)
    r.add_argument("--device", default="CPU")
    r.add_argument("--save", metavar="OUT.npz", help="save the outputs")
    r.add_argument("--no-check", action="store_true")
    r.add_argument("--integer-arithmetic", default="exact",
                   choices=["exact", "saturating-u8s8"],
                   help="8-bit integer products: exact (the ONNX spec, default) or as "
                        "onnxruntime computes them on x86 CPUs without VNNI")
    r.set_defaults(func=cmd_run)
    d = sub.add_parser("demo", help="the main job on the embedded default model")
    d.set_defaults(func=cmd_demo)
    v = sub.add_parser("view", help="open a model in Netron")
    v.add_argument("model")
    v.add_argument("rest", nargs=argparse.REMAINDER,
                   help="--port N, --host ADDR, --no-browser, --timeout S (see workbench view -h)")
    v.set_defaults(func=cmd_view)
    c = sub.add_parser("conformance", help="run the ONNX node conformance cases")
    c.add_argument("-k", action="append")
    c.add_argument("--failures", action="store_true")
    c.set_defaults(func=cmd_conformance)
    _add_profile_parser(sub)
    _add_warmup_parser(sub)
    from workbench.edit.cli import add_edit_parser  # model surgery: workbench/edit/cli.py
    add_edit_parser(sub)


    add_classroom_parsers(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("WORKBENCH_DEBUG", "") not in ("", "0")
    try:
        return args.func(args)
    except WorkbenchError as e:
        if debug:
            traceback.print_exc()
        print(f"workbench {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: still one line, the traceback on request
        if debug:
            traceback.print_exc()
        print(f"workbench {args.command}: internal error: {type(e).__name__}: {_one_line(e)} "
              f"(this is a bug in ONNX Workbench; run with --debug for the traceback and "
              f"please report it)", file=sys.stderr)
        return 3


def _one_line(e: BaseException) -> str:
    return " | ".join(line.strip() for line in str(e).splitlines() if line.strip())


if __name__ == "__main__":
    sys.exit(main())
