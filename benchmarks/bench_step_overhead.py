"""The run loop's cost per step: a chain of trivial nodes on tiny tensors.

A 200-node chain (``Add`` of a 1-element constant, or ``Identity``) on a (1,)-float32 input
costs almost nothing in its kernels, so a run's time divided by the number of nodes is what the
executor adds per step: gathering arguments, calling, storing, freeing. Measured for the ways a
Plan runs:

- ``plain``    - a CPU plan without a shape segment (the plain schedule);
- ``fast``     - the same chain behind a Shape -> Gather -> Unsqueeze -> Reshape (to the same
  shape) segment (the fast schedule of plain CPU runs);
- ``hook``     - the plain chain with a per-node hook (what the tensor inspector does);
- ``runner``   - the plain chain on Tensors through ``autograd.TapeRunner`` (SONNXModel.forward);
- ``backend``  - the plain chain through the ONNX backend API, ``backend.prepare(model,
  optimize=False).run(x)`` (the feed handling of ``WorkbenchRep.run`` included);
- ``ort``      - onnxruntime's ``InferenceSession.run`` on the same chain (one intra-op
  thread, graph optimisations off so that the chain is not folded away), for comparison.

Each case runs in this process: ``--repeat`` batches of ``--runs`` runs, the best batch's mean
reported as nanoseconds per step, in CPU time of this process (``--clock process``, the
default: time spent waiting for a core on a busy machine is not counted) or wall time
(``--clock wall``). Compare two checkouts by running this file with each on the
path, alternating, on a quiet machine:

    PYTHONPATH=/path/to/checkout python benchmarks/bench_step_overhead.py
    python benchmarks/bench_step_overhead.py --nodes 500 --runs 400 --json out.json

Not part of the test pass/fail.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def chain(n: int, op: str, segment: bool):
    """The ONNX model of an ``n``-node chain of ``op`` (Add of a constant, or Identity)."""
    inits = [numpy_helper.from_array(np.ones(1, np.float32), "one")]
    nodes = []
    prev = "x"
    if segment:
        inits += [numpy_helper.from_array(np.asarray(v, np.int64), k)
                  for k, v in (("i0", 0), ("ax0", [0]))]
        nodes += [helper.make_node("Shape", ["x"], ["s"]),
                  helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
                  helper.make_node("Unsqueeze", ["b", "ax0"], ["target"]),
                  helper.make_node("Reshape", ["x", "target"], ["x0"])]
        prev = "x0"
    for k in range(n):
        out = "y" if k == n - 1 else f"v{k}"
        ins = [prev, "one"] if op == "Add" else [prev]
        nodes.append(helper.make_node(op, ins, [out], name=f"n{k}"))
        prev = out
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def per_step_ns(fn, n_steps: int, runs: int, repeat: int, clock=time.process_time) -> float:
    for _ in range(max(3, runs // 10)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        for _ in range(runs):
            fn()
        best = min(best, (clock() - t0) / runs)
    return best / n_steps * 1e9


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--runs", type=int, default=200, help="runs per timed batch")
    ap.add_argument("--repeat", type=int, default=15, help="timed batches (best one kept)")
    ap.add_argument("--cases", nargs="+", default=["plain", "fast", "hook", "runner", "backend",
                                                   "ort"],
                    choices=["plain", "fast", "hook", "runner", "backend", "ort"])
    ap.add_argument("--clock", choices=["process", "wall"], default="process")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)

    import workbench
    from workbench import autograd
    from workbench.graph.load import load
    from workbench.runtime.plan import Plan

    x = np.ones(1, np.float32)
    out = {"cpu": platform.processor() or platform.machine(), "workbench": workbench.__file__,
           "nodes": a.nodes, "clock": a.clock, "results": {}}
    for op in ("Add", "Identity"):
        for case in a.cases:
            model = chain(a.nodes, op, segment=case == "fast")
            plan = Plan(load(model).graph)
            steps = len(plan.steps)
            if case == "backend":
                from workbench import backend
                rep = backend.prepare(model, optimize=False)

                def fn(rep=rep):
                    return rep.run(x)
            elif case == "ort":
                try:
                    import onnxruntime as ort
                except ImportError:
                    continue
                so = ort.SessionOptions()
                so.intra_op_num_threads = so.inter_op_num_threads = 1
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                sess = ort.InferenceSession(model.SerializeToString(), so,
                                            providers=["CPUExecutionProvider"])

                def fn(sess=sess):
                    return sess.run(None, {"x": x})
            elif case == "hook":
                def fn(plan=plan):
                    return plan.run([x], hook=lambda node, outs: None)
            elif case == "runner":
                runner = autograd.TapeRunner()
                xt = autograd.Tensor(data=x)

                def fn(plan=plan, runner=runner, xt=xt):
                    with autograd.no_grad():
                        return plan.execute([xt], runner=runner)
            else:
                def fn(plan=plan):
                    return plan.run([x])
            ns = per_step_ns(fn, steps, a.runs if case != "runner" else max(20, a.runs // 5),
                             a.repeat, time.process_time if a.clock == "process"
                             else time.perf_counter)
            out["results"][f"{op}/{case}"] = round(ns, 1)
            print(f"{op:8s} {case:7s} {steps:4d} steps  {ns:8.1f} ns/step", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    sys.exit(main() and 0)
