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
                      [--ours] [--memory [--train]]
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


INPUT_FORMATS = ("--input takes NAME=FILE with FILE a NumPy .npy file (np.save(path, array)), "
                 "an .npz archive (np.savez; FILE.npz:KEY picks one of its arrays) or an ONNX "
                 "TensorProto .pb file (as in ONNX's test_data_set_* folders)")


def _read_input(spec: str, name: str, path: str) -> np.ndarray:
    """The array of ``--input NAME=FILE`` (.npy, .npz[:KEY], ONNX TensorProto .pb)."""
    key = None
    if not os.path.exists(path) and ":" in path:
        path, key = path.rsplit(":", 1)
    if not os.path.exists(path):
        raise WorkbenchError(f"--input {spec!r}: file {path!r} not found")
    if os.path.isdir(path):
        raise WorkbenchError(f"--input {spec!r}: {path!r} is a folder. {INPUT_FORMATS}")
    with open(path, "rb") as f:
        head = f.read(64)
    if path.endswith(".pb") and not head.startswith(b"\x93NUMPY"):
        import onnx
        from onnx import numpy_helper
        t = onnx.TensorProto()
        try:
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            return numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 - protobuf's and onnx's errors alike
            raise WorkbenchError(f"--input {spec!r}: {path!r} is not an ONNX TensorProto "
                                 f"({type(e).__name__}: {e}). {INPUT_FORMATS}") from None
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as e:
        if head.startswith(b"\x93NUMPY"):
            why = f"a .npy file whose array needs pickle to load (object dtype; refused): {e}"
        elif head.startswith(b"\x80"):
            why = "a Python pickle (refused: unpickling runs code)"
        elif head.startswith(b"PK"):
            why = "a ZIP archive that is not an .npz of arrays"
        else:
            text = head.decode("utf-8", "replace")
            printable = all(c.isprintable() or c.isspace() for c in text)
            why = (f"a text file (it starts with {text[:30]!r}); convert it once in Python, "
                   f"e.g. np.save('x.npy', np.loadtxt(path, dtype=np.float32).reshape(...))"
                   if printable else "not a NumPy file")
        raise WorkbenchError(f"--input {spec!r}: {path!r} is {why}. {INPUT_FORMATS}") from None
    except OSError as e:
        raise WorkbenchError(f"--input {spec!r}: cannot read {path!r}: {e}") from None
    if isinstance(data, np.ndarray):
        if key is not None:
            raise WorkbenchError(f"--input {spec!r}: {path!r} is an .npy file holding one "
                                 f"array; ':{key}' picks an array of an .npz archive")
        return data
    with data:     # an .npz archive
        keys = list(data.keys())
        if key is None:
            key = keys[0] if len(keys) == 1 else name if name in keys else None
        if key not in keys:
            raise WorkbenchError(
                f"--input {spec!r}: {path!r} holds the arrays {keys}"
                + (f", not {key!r}" if key is not None else
                   f"; pick one with {name}={path}:KEY"))
        return data[key]


def _input_shapes(graph, skip, shapes: dict, dims: dict) -> tuple[dict, dict]:
    """({input name: shape}, {input name: [guessed dim positions]}) for the inputs not in
    ``skip`` (given as files): ``--shape`` first, then ``--dim`` for symbolic dims; any other
    dim that is not a fixed size is a guess (1)."""
    names = [v.name for v in graph.inputs]
    unknown = [k for k in shapes if k not in names]
    if unknown:
        raise WorkbenchError(f"--shape {unknown[0]}=...: the model has no input "
                             f"{unknown[0]!r} (its inputs are {names})")
    symbols = {d for v in graph.inputs for d in (v.shape or ()) if isinstance(d, str)}
    stray = [k for k in dims if k not in symbols]
    if stray:
        have = (f"its symbolic dims are {sorted(symbols)}" if symbols else
                "it has no named symbolic dims (use --shape NAME=1,3,224,224)")
        raise WorkbenchError(f"--dim {stray[0]}=...: the model's inputs have no dim named "
                             f"{stray[0]!r}; {have}")
    out, guessed = {}, {}
    for v in graph.inputs:
        if v.name in skip:
            continue
        if v.name in shapes:
            from workbench.analysis.shapes import bind
            out[v.name] = bind([v], {v.name: shapes[v.name]})[v.name]   # rank and fixed dims
            continue
        if v.shape is None:
            raise WorkbenchError(f"input {v.name!r}: the model does not declare its shape; "
                                 f"give it with --shape {v.name}=D0,D1,... or --input "
                                 f"{v.name}=FILE.npy")
        s, g = [], []
        for i, d in enumerate(v.shape):
            if isinstance(d, int) and d > 0:
                s.append(d)
            elif isinstance(d, str) and d in dims:
                s.append(int(dims[d]))
            else:
                s.append(1)
                g.append(i)
        out[v.name] = tuple(s)
        if g:
            guessed[v.name] = g
    return out, guessed


def _random_inputs(graph, shapes: dict, seed: int = 0) -> dict:
    from workbench.arrays.dtypes import np_dtype_of_onnx
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        if v.name not in shapes:
            continue
        shape = shapes[v.name]
        if v.type_proto is not None and not v.is_tensor:
            raise WorkbenchError(f"cannot make a random value for input {v.name!r} (not a "
                                 f"tensor); give it with --input {v.name}=FILE.npy")
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


def _load_inputs(args, graph) -> tuple[dict, list, list]:
    """(feeds, notes, guesses) from ``--input``, ``--shape`` and ``--dim``: files where given,
    random values elsewhere; ``guesses`` says which shapes were guessed (for error hints)."""
    specs = getattr(args, "input", None) or []
    names = [v.name for v in graph.inputs]
    feeds = {}
    for spec in specs:
        if "=" not in spec:
            raise WorkbenchError(f"--input {spec!r}: expected NAME=FILE. {INPUT_FORMATS}")
        name, path = spec.split("=", 1)
        if name not in names:
            raise WorkbenchError(f"--input {spec!r}: the model has no input {name!r} "
                                 f"(its inputs are {names})")
        feeds[name] = _read_input(spec, name, path)
    single = names[0] if len(names) == 1 else None
    shapes = _shape_args(getattr(args, "shape", None), "--shape", single)
    dims = _shape_args(getattr(args, "dim", None), "--dim")
    both = sorted(set(shapes) & set(feeds))
    if both:
        raise WorkbenchError(f"input {both[0]!r} is given twice, by --input and --shape")
    bound, guessed = _input_shapes(graph, set(feeds), shapes, dims)
    feeds.update(_random_inputs(graph, bound))
    notes, guesses = [], []
    decl = {v.name: v.shape for v in graph.inputs}
    for n in names:
        if n in feeds and n not in bound:
            continue
        shape = list(feeds[n].shape)
        if n in guessed:
            syms = [decl[n][i] for i in guessed[n]]
            what = ", ".join(repr(d) if isinstance(d, str) else f"dim {i}"
                             for i, d in zip(guessed[n], syms))
            guesses.append(f"{n} {shape}")
            notes.append(f"input {n!r}: random values of shape {shape}; its symbolic "
                         f"dim(s) {what} were set to 1, a guess: give the real shape with "
                         f"--shape {n}={','.join(str(d) for d in _example_dims(decl[n]))}"
                         + (f" or --dim {syms[0]}=N" if isinstance(syms[0], str) else ""))
        else:
            notes.append(f"input {n!r}: random values of shape {shape}")
    return feeds, notes, guesses


def _example_dims(shape) -> list:
    """The declared dims for a --shape hint, symbolic ones as <name> (<?> when unnamed)."""
    return [d if isinstance(d, int) and d > 0 else f"<{d}>" if isinstance(d, str) else "<?>"
            for d in shape]


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
        feeds, notes, _ = _load_inputs(args, loaded.graph)
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
    elif args.input or args.shape or args.dim:
        raise WorkbenchError("--input, --shape and --dim are used with --saturation "
                             "(workbench info MODEL --saturation --input NAME=FILE.npy)")
    return 0


def cmd_run(args) -> int:
    import workbench.backend as backend
    ort = _onnxruntime_for_compare() if args.compare else None   # before any timed run
    rep = backend.prepare(args.model, args.device, check=not args.no_check,
                          integer_arithmetic=args.integer_arithmetic)
    graph = rep.loaded.graph
    if args.integer_arithmetic != "exact":
        print(f"note: integer products computed as '{args.integer_arithmetic}' (onnxruntime's "
              f"arithmetic on x86 CPUs without VNNI), not exactly as the ONNX spec says")
    feeds, notes, guesses = _load_inputs(args, graph)
    for n in notes:
        print("note:", n)
    try:
        t, outs = _time(lambda: rep.run(feeds), args.repeat)
    except WorkbenchError as e:
        if not guesses:
            raise
        raise WorkbenchError(f"{e} -- the input shape(s) {'; '.join(guesses)} were guessed "
                             f"(symbolic dims set to 1): give real ones with --shape "
                             f"NAME=D0,D1,... or --dim SYMBOL=N") from e
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
    if ort is not None:
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


def _onnxruntime_for_compare():
    """onnxruntime for ``--compare onnxruntime``, or an error before anything runs."""
    try:
        import onnxruntime
    except ImportError as e:
        raise WorkbenchError(f"--compare onnxruntime needs the onnxruntime package, which "
                             f"cannot be imported here ({e}): pip install onnxruntime (or the "
                             f"test extra), or leave out --compare") from None
    return onnxruntime


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
    sample = np.load(os.path.join(os.path.dirname(path), "digits_sample.npz"),
                     allow_pickle=False)
    images, labels = sample["images"], sample["labels"]
    _save_demo_files(args, path, images)
    print("ONNX Workbench demo: the embedded default model (a digits CNN), offline\n")
    loaded = load(path)
    describe(loaded)
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


def _save_demo_files(args, model_path: str, images: np.ndarray) -> None:
    """``--save-model`` / ``--save-images``: the embedded model and digits, to try the other
    commands on. Written atomically; an existing file is kept when it holds the same bytes
    and refused otherwise (unless ``--force``)."""
    import io

    from workbench.files import write_atomic
    with open(model_path, "rb") as f:
        model_bytes = f.read()
    buf = io.BytesIO()
    np.save(buf, images, allow_pickle=False)
    for target, data, what in ((args.save_model, model_bytes, "the model"),
                               (args.save_images, buf.getvalue(),
                                f"{len(images)} digits, float32 {list(images.shape)}")):
        if not target:
            continue
        if os.path.isfile(target) and not args.force:
            with open(target, "rb") as f:
                if f.read() == data:
                    print(f"{target}: already there ({what})")
                    continue
            raise WorkbenchError(f"{target} exists and holds something else; give another "
                                 f"path, or --force to replace it")
        write_atomic(target, lambda f, d=data: f.write(d), overwrite=args.force)
        print(f"wrote {target} ({what})")


def cmd_view(args) -> int:
    try:
        from workbench.widgets.netron_view import view_main
    except ImportError as e:
        raise WorkbenchError(f"workbench view needs the lab extra ({e}); "
                             f"pip install -e '.[lab]'") from None
    return view_main(args.argv)


def cmd_conformance(args) -> int:
    from workbench import conformance
    return conformance.run(args)


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
    if args.roofline or args.ort or args.ours:
        a.roofline(recalibrate=args.recalibrate)
    if args.ort:
        a.profile_ort(runs=args.ort_runs)
    if args.ours:
        a.profile_ours(runs=args.ours_runs)
    print(a.summary())
    if args.ours:
        print(f"  ours: {a.ours.describe()}")
    if args.memory or args.train:
        print(a.memory(measure=True).summary())
    if args.train:
        print(a.memory(training=True, measure=True).summary())
    groups = a.groups(args.group_depth)
    rows = groups.to_dict("records") if hasattr(groups, "to_dict") else groups
    rows.sort(key=lambda r: -(r["flops"] or 0))
    cols = ["group", "nodes", "macs", "flops", "params", "bytes_read", "bytes_written"]
    if args.ours:
        cols.append("time_ours_ms")
    if args.ort:
        cols.append("time_ort_ms")
    print(f"\nper group (name scope, depth {args.group_depth}), by FLOPs:")
    print(markdown_table(rows[:args.top], cols))
    if args.markdown:
        print("\nevery node:")
        print(a.to_markdown())
    else:
        key = "time_ours_ms" if args.ours else "time_ort_ms" if args.ort else "flops"
        hide = set() if args.roofline or args.ort or args.ours else {"bound"}
        if not args.ours:
            hide.add("time_ours_ms")
        if not args.ort:
            hide.add("time_ort_ms")
        if not (args.ort or args.ours):
            hide.add("pct_of_roof")
        cols = [c for c in MARKDOWN_COLUMNS if c not in hide]
        print(f"\ntop {args.top} nodes by {key} (--markdown for all):")
        print(a.to_markdown(cols, top=args.top, sort=key))
    if args.csv:
        a.to_csv(args.csv, overwrite=args.force)
        print(f"\nwrote {len(a.records)} rows to {args.csv}")
    return 0


def _add_profile_parser(sub) -> None:
    pr = sub.add_parser("profile", help="per-node FLOPs, parameters, bytes and roofline")
    pr.add_argument("model", help=MODEL_HELP)
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
    pr.add_argument("--ort-runs", type=int, default=10,
                    help="onnxruntime runs profiled for --ort (default 10)")
    pr.add_argument("--ours", action="store_true",
                    help="our engine's per-node times (kernel calls only; implies --roofline)")
    pr.add_argument("--ours-runs", type=int, default=20,
                    help="runs timed for --ours (default 20)")
    pr.add_argument("--memory", action="store_true",
                    help="memory over the engine's schedule: the peak, the values that make it, "
                         "a measured run beside it")
    pr.add_argument("--train", action="store_true",
                    help="with --memory: also a training step (saved activations, gradients)")
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
    a.add_argument("notebooks", nargs="+", metavar="INSTRUCTOR.ipynb",
                   help="instructor notebooks: exercises with solutions between markers")
    a.add_argument("--out", required=True, help="folder for the students' notebooks and keys")
    a.add_argument("--file", action="append", metavar="PATH",
                   help="a file the notebook reads (relative to it), handed out with it")
    a.add_argument("--overwrite", action="store_true", help="replace existing files in --out")
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
    g.add_argument("--overwrite", action="store_true", help="replace existing files in --out")
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
    mods = args.modules or compiled.modules()
    why = compiled.cannot_build(mods)
    if why:
        raise WorkbenchError(f"cannot compile kernels here: {why}")
    from workbench.compiled import cache
    print(f"compiling {len(mods)} kernel module(s) for this CPU into {cache.cache_dir()} "
          f"(once per machine and engine version; runs use numpy meanwhile)", flush=True)
    report = compiled.warmup(mods, force=args.force,
                             progress=lambda line: print(line, flush=True))
    bad = {m: r for m, r in report["modules"].items() if not r["ok"]
           and not r.get("unavailable")}
    skipped = {m: r for m, r in report["modules"].items() if r.get("unavailable")}
    print(f"done in {report['seconds']:.1f} s: {len(mods) - len(bad) - len(skipped)} "
          f"module(s) ready, {len(bad)} failed"
          + (f", {len(skipped)} unavailable here (numpy runs their work)" if skipped else ""))
    for m, r in skipped.items():
        print(f"  {m}: unavailable: {r['error']}")
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



MODEL_HELP = "path to an .onnx file"


def _add_input_options(p, input_help: str) -> None:
    p.add_argument("--input", action="append", metavar="NAME=FILE", help=input_help)
    p.add_argument("--shape", action="append", metavar="NAME=1,3,224,224",
                   help="random values of this shape for an input (repeat per input; NAME= "
                        "may be left out for a one-input model)")
    p.add_argument("--dim", action="append", metavar="SYMBOL=N",
                   help="the size of a symbolic dim of the inputs, e.g. --dim batch=1 "
                        "--dim seq=128 (symbolic dims set neither way are 1, a guess)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="ONNX Workbench command line")
    p.add_argument("--debug", action="store_true",
                   help="print the full traceback of an error (also WORKBENCH_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("info", help="describe a model",
                       description="Inputs and outputs, opsets, the op histogram, parameters "
                                   "and which ops the engine lacks.")
    a.add_argument("model", help=MODEL_HELP)
    a.add_argument("--no-check", action="store_true", help="skip onnx.checker")
    a.add_argument("--saturation", action="store_true",
                   help="report where the model's uint8 x int8 products would saturate on x86 "
                        "CPUs without VNNI (onnxruntime's arithmetic there), on the --input "
                        "files or random inputs")
    _add_input_options(a, "calibration input for --saturation (random values otherwise)")
    a.set_defaults(func=cmd_info)
    r = sub.add_parser("run", help="run a model (random inputs unless given)",
                       description="Run a model on the engine: the given inputs, or random "
                                   "values at the declared shapes (symbolic dims from --shape "
                                   "or --dim, else 1, a guess the output says); time it and "
                                   "optionally compare with onnxruntime.",
                       epilog="example: workbench run ocr.onnx --shape x=1,3,48,320 "
                              "--compare onnxruntime")
    r.add_argument("model", help=MODEL_HELP)
    _add_input_options(r, "an input's value from a file (repeat per input; the others get "
                          "random values). " + INPUT_FORMATS)
    r.add_argument("--compare", choices=["onnxruntime"],
                   help="also run onnxruntime (checked before anything runs) and print the "
                        "time ratio and each output's largest difference")
    r.add_argument("--repeat", type=int, default=5,
                   help="timed runs after one warm-up; the median is printed (default 5)")
    r.add_argument("--device", default="CPU",
                   help="CPU (default) or CUDA:0 (needs a GPU and the gpu-cuda12 or "
                        "gpu-cuda13 extra)")
    r.add_argument("--save", metavar="OUT.npz", help="save the outputs (np.savez)")
    r.add_argument("--no-check", action="store_true", help="skip onnx.checker")
    r.add_argument("--integer-arithmetic", default="exact",
                   choices=["exact", "saturating-u8s8"],
                   help="8-bit integer products: exact (the ONNX spec, default) or as "
                        "onnxruntime computes them on x86 CPUs without VNNI")
    r.set_defaults(func=cmd_run)
    d = sub.add_parser("demo", help="the main job on the embedded default model",
                       description="Load the embedded digits CNN, describe it, classify 32 "
                                   "held-out digits and cross-check with onnxruntime (when "
                                   "installed); offline.")
    d.add_argument("--save-model", metavar="PATH.onnx",
                   help="also write the embedded model (input 'image', float32 [batch, 1, 8, "
                        "8]) there, to try the other commands on")
    d.add_argument("--save-images", metavar="PATH.npy",
                   help="also write its 32 held-out digits there (an --input for workbench run)")
    d.add_argument("--force", action="store_true",
                   help="replace existing files given to --save-model/--save-images")
    d.set_defaults(func=cmd_demo)
    v = sub.add_parser("view", add_help=False, help="open a model in Netron (needs the lab extra)",
                       description="Serve a model in Netron, the model viewer, on 127.0.0.1 "
                                   "until Ctrl-C (needs the lab extra, which installs netron). "
                                   "In JupyterLab, double-clicking an .onnx file opens the "
                                   "workbench's own viewer instead.")
    # its arguments (MODEL, --port, --host, --no-browser, --timeout) are view_main's own:
    # main() hands them over as they are, so `workbench view -h` prints them
    v.set_defaults(func=cmd_view, passes_arguments_on=True)
    c = sub.add_parser("conformance", help="run the ONNX node conformance cases",
                       description="Run the ONNX node test cases of the installed onnx "
                                   "package through the engine; print passed/total overall "
                                   "and per operator.")
    from workbench.conformance import add_arguments
    add_arguments(c)
    c.set_defaults(func=cmd_conformance)
    _add_profile_parser(sub)
    _add_warmup_parser(sub)
    from workbench.edit.cli import add_edit_parser  # model surgery: workbench/edit/cli.py
    add_edit_parser(sub)
    add_classroom_parsers(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passes_arguments_on", False):
        args.argv = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
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
