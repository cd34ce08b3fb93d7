"""Fuzz the engine with hostile and broken models (issue 10), onnxruntime beside it.

Each case runs in a child worker process with an address-space limit and a timeout and is
classified ok / clean / uncaught / crash / hang / memory / leak (onnxruntime: ok / refused /
crash / hang / memory / leak). Prints a table by generator and class, the failures grouped by
where they come from, and writes the failing cases to a JSON file that ``--replay`` runs again.

    python benchmarks/fuzz.py --cases 10000 --seed 0 --workers 2 --ort
    python benchmarks/fuzz.py --cases 500 --generators mut_attr resource
    python benchmarks/fuzz.py --ci                       # the fixed CI sample
    python benchmarks/fuzz.py --case mut_bytes:30        # one case, verbose
    python benchmarks/fuzz.py --replay test-artifacts/fuzz-failures.json

Generators and classes: tests/fuzz/generators.py, tests/fuzz/worker.py; see
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import generators as G  # noqa: E402
from tests.fuzz.harness import FAILURES, ORT_CLASSES, OUR_CLASSES, Pool  # noqa: E402

ORT_FAILURES = {"crash", "hang", "memory", "leak"}


def _table(rows: list[str], counts: dict, classes: list[str], title: str) -> str:
    head = f"| {title} | " + " | ".join(classes) + " | total |"
    out = [head, "|---|" + "---:|" * (len(classes) + 1)]
    total = collections.Counter()
    for r in rows:
        c = counts.get(r, collections.Counter())
        total.update(c)
        out.append(f"| {r} | " + " | ".join(str(c.get(k, 0)) for k in classes)
                   + f" | {sum(c.values())} |")
    out.append("| **all** | " + " | ".join(f"**{total.get(k, 0)}**" for k in classes)
               + f" | **{sum(total.values())}** |")
    return "\n".join(out)


def _group_key(res: dict) -> tuple:
    return (res["cls"], res.get("error_type", ""), res.get("frame", "") or
            str(res.get("message", ""))[:30])


def report(cases, ours, ort, seconds: float, out=sys.stdout):
    gens = [g for g in G.GENERATORS if any(c.generator == g for c in cases)]
    by = collections.defaultdict(collections.Counter)
    for c, r in zip(cases, ours):
        by[c.generator][r["cls"]] += 1
    print(f"\n{len(cases)} cases in {seconds:.0f} s\n", file=out)
    print("ours:\n", file=out)
    print(_table(gens, by, OUR_CLASSES, "generator"), file=out)
    if ort:
        by_o = collections.defaultdict(collections.Counter)
        for c, r in zip(cases, ort):
            by_o[c.generator][r["cls"]] += 1
        print("\nonnxruntime on the same cases:\n", file=out)
        print(_table(gens, by_o, ORT_CLASSES, "generator"), file=out)
        pairs = collections.Counter((a["cls"], b["cls"]) for a, b in zip(ours, ort))
        print("\nours x onnxruntime:\n", file=out)
        print("| ours \\ ort | " + " | ".join(ORT_CLASSES) + " |", file=out)
        print("|---|" + "---:|" * len(ORT_CLASSES), file=out)
        for k in OUR_CLASSES:
            if any(pairs.get((k, o)) for o in ORT_CLASSES):
                print(f"| {k} | " + " | ".join(str(pairs.get((k, o), 0)) for o in ORT_CLASSES)
                      + " |", file=out)
    slow = sorted(((r.get("seconds") or 0, c, r) for c, r in zip(cases, ours)
                   if r["cls"] != "hang" and (r.get("seconds") or 0) > 5), key=lambda t: -t[0])
    if slow:
        print(f"\nslowest of ours (over 5 s, {len(slow)}):", file=out)
        for sec, c, r in slow[:8]:
            print(f"- {sec:6.1f} s {c.key} [{r['cls']}] {c.note[:100]}", file=out)
    groups = collections.defaultdict(list)
    for c, r in zip(cases, ours):
        if r["cls"] in FAILURES:
            groups[(c.generator, *_group_key(r))].append((c, r))
    if groups:
        print(f"\nour failures, grouped ({sum(len(v) for v in groups.values())}):", file=out)
        for (gen, cls, et, where), items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            c, r = items[0]
            why = f" ({r['why']})" if r.get("why") else ""
            print(f"- {len(items):4d} x {gen} {cls} {et}{why} @ {where}\n"
                  f"         e.g. {c.key}: {c.note[:110]}\n"
                  f"         {str(r.get('message', ''))[:200]!r}", file=out)
    if ort:
        bad = [(c, r) for c, r in zip(cases, ort) if r["cls"] in ORT_FAILURES]
        if bad:
            print(f"\nonnxruntime failures ({len(bad)}), first 10:", file=out)
            for c, r in bad[:10]:
                print(f"- {c.key} {r['cls']} {r.get('message', '')!r:.120} ({c.note[:80]})",
                      file=out)


def write_failures(path: str, cases, ours, ort):
    items = []
    for i, (c, r) in enumerate(zip(cases, ours)):
        o = ort[i] if ort else None
        if r["cls"] in FAILURES or (o and o["cls"] in ORT_FAILURES):
            items.append({"case": c.to_json(), "ours": r, "ort": o})
    with open(path, "w") as f:
        json.dump({"failures": items}, f, indent=1)
    return len(items)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    ap.add_argument("--memory-limit", type=float, default=3.0, help="GiB per worker (RLIMIT_AS)")
    ap.add_argument("--ort", action="store_true", help="run onnxruntime on the same cases")
    ap.add_argument("--generators", nargs="*", help="only these generators")
    ap.add_argument("--ci", action="store_true", help="run the fixed CI sample")
    ap.add_argument("--case", nargs="*", help="GENERATOR:SEED cases to run, verbose")
    ap.add_argument("--replay", help="a failures JSON written by this script")
    ap.add_argument("--out", default=str(ROOT / "test-artifacts" / "fuzz-failures.json"),
                    help="failing cases go here (default: test-artifacts/fuzz-failures.json)")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    if args.replay:
        with open(args.replay) as f:
            cases = [G.Case.from_json(it["case"]) for it in json.load(f)["failures"]]
    elif args.case:
        cases = []
        for k in args.case:
            g, s = k.split(":")
            cases.append(G.make_case(g, int(s)))
    elif args.ci:
        cases = [G.make_case(g, s) for g, s in G.ci_sample()]
    else:
        if args.generators:
            unknown = set(args.generators) - set(G.GENERATORS)
            if unknown:
                ap.error(f"unknown generators {sorted(unknown)}; known: {sorted(G.GENERATORS)}")
        plan = G.sweep(args.cases, args.seed, only=args.generators)
        cases = [G.make_case(g, s) for g, s in plan]
    gen_s = time.monotonic() - t0
    print(f"{len(cases)} cases generated in {gen_s:.1f} s; running with {args.workers} workers"
          f"{' (+ onnxruntime)' if args.ort else ''}, {args.timeout:g} s timeout, "
          f"{args.memory_limit:g} GiB address space", file=sys.stderr)

    jobs = [(c, "ours") for c in cases]
    if args.ort:
        jobs += [(c, "ort") for c in cases]
    last = [time.monotonic()]

    def progress(done, total, case, mode, res):
        if (args.case or args.replay) and mode == "ours":
            print(f"{case.key} [{res['cls']}] {case.note[:120]}\n    {res.get('error_type', '')}"
                  f": {str(res.get('message', ''))[:400]} @ {res.get('frame', '')} "
                  f"({res.get('seconds', 0)} s)", file=sys.stderr)
        elif time.monotonic() - last[0] > 30 or done == total:
            last[0] = time.monotonic()
            print(f"  {done}/{total} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)

    t1 = time.monotonic()
    mem = int(args.memory_limit * 2**30)
    with Pool(workers=args.workers, timeout=args.timeout, memory_limit=mem, ort=args.ort) as p:
        results = p.run(jobs, progress=progress)
    seconds = time.monotonic() - t1
    ours = results[: len(cases)]
    ort = results[len(cases):] if args.ort else None
    report(cases, ours, ort, seconds)
    if not (args.replay or args.case):
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        n = write_failures(args.out, cases, ours, ort)
        if n:
            print(f"\n{n} failing cases written to {args.out} (replay: python "
                  f"benchmarks/fuzz.py --replay {args.out})")
        elif os.path.exists(args.out):
            os.unlink(args.out)
    return 1 if any(r["cls"] in FAILURES for r in ours) else 0


if __name__ == "__main__":
    sys.exit(main())
