"""Seeded case generators for the hostile-model fuzzer (issue 10).

Every generator is a function ``gen(seed) -> Case``, deterministic for a given seed (and a given
onnx version, whose node test models are one of the sources). A :class:`Case` is what a worker
needs to reproduce a run: the model file's bytes, the extra files to place beside it (external
data, symlinks, FIFOs, folders), how to hand the model to the engine (a path, bytes without
``base_dir``, bytes with ``base_dir``) and the inputs (given, or made from the declared input
types).

Paths outside the model folder are not known when a case is generated; external-data strings
and symlink targets may contain these tokens, replaced by the worker:

- ``@PARENT@`` the model folder's parent (holds a sentinel ``secret.txt``)
- ``@CWD@`` the worker's current directory (holds a sentinel ``secret.txt``)
- ``@TMP@`` a folder in /tmp (holds a sentinel ``secret.txt``)
- ``@MODEL_DIR@`` the model folder itself

Generators (the table of ``benchmarks/fuzz.py`` groups by these names):

``mut_attr``     attribute extremes on node test models, scikit-learn models converted by
                 skl2onnx (ai.onnx.ml operators) and our small models (the mutation
                 generators give a third of their cases with ``check=False``)
``mut_graph``    dtype/rank/dim changes, removed/duplicated/renamed inputs and outputs, dangling
                 edges, cycles, duplicated/removed/reordered nodes, unknown ops and domains
``mut_meta``     bad opset imports, IR versions, recursive or broken model-local functions
``mut_rawdata``  tensors whose data does not match their dims and dtype
``mut_bytes``    truncated, byte-flipped, spliced or random files; names made invalid UTF-8
``mut_mix``      two to four of the mutations above at once, half with ``check=False``
``mut_inputs``   valid models run with hostile inputs: extreme values (shape-like int inputs
                 too), changed shapes/dtypes, big-endian, non-contiguous, read-only, not arrays,
                 missing or unknown inputs
``extdata``      every external-data attack on every tensor carrier (model given by path);
                 enumerated: seed ``i`` is combination ``i % len(EXTDATA_COMBOS)``
``extdata_feed`` external data in a model given as bytes or a ModelProto (without
                 ``base_dir``), as bytes with ``base_dir``, through a symlinked folder, or
                 by path with the checker off (``check=False``); enumerated
``resource``     shapes, counts and attributes that ask for huge memory or endless loops, or
                 that have crashed onnx's C++ shape inference
"""

from __future__ import annotations

import base64
import copy
import os
import pickle
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

OPSET = 17


# =========================================================================== the case
@dataclass
class Case:
    generator: str
    seed: int
    model: bytes                       # the model file's bytes
    files: list = field(default_factory=list)   # [(relpath, kind, data)], see place_files
    # "path" | "bytes" | "proto" (a ModelProto) | "bytes_base_dir" | "path_nocheck" (check=False)
    # | "path_via_link" (the model's folder reached through a symlink)
    feed: str = "path"
    inputs: list | None = None         # [(name, ndarray)] or None: made from declared types
    substitute: bool = False           # replace @TOKENS@ in external-data strings
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.generator}:{self.seed}"

    def to_json(self) -> dict:
        """A JSON-able dict (bytes and arrays base64-encoded) for replay files."""
        return {
            "generator": self.generator, "seed": self.seed, "note": self.note,
            "feed": self.feed, "substitute": self.substitute,
            "model": base64.b64encode(self.model).decode(),
            "files": [[p, k, base64.b64encode(d).decode() if isinstance(d, bytes) else d]
                      for p, k, d in self.files],
            "inputs": None if self.inputs is None else base64.b64encode(
                pickle.dumps(self.inputs)).decode(),
        }

    @classmethod
    def from_json(cls, d: dict) -> Case:
        files = []
        for p, k, data in d["files"]:
            files.append((p, k, base64.b64decode(data) if k == "file" else data))
        inputs = None if d.get("inputs") is None else pickle.loads(  # noqa: S301 - our own file
            base64.b64decode(d["inputs"]))
        return cls(d["generator"], int(d["seed"]), base64.b64decode(d["model"]), files,
                   d["feed"], inputs, bool(d["substitute"]), d.get("note", ""))


# =========================================================================== small helpers
def vi(name, shape, dt=TensorProto.FLOAT, rank: int = 1):
    """A tensor ValueInfo; ``shape=None``: ``rank`` symbolic dims (onnx's checker wants a shape
    on graph inputs and outputs; a wrong rank is kept as declared and does not matter here)."""
    if shape is None:
        shape = [f"{name}_{i}" for i in range(rank)]
    return helper.make_tensor_value_info(name, dt, shape)


def mk(nodes, inputs, outputs, inits=(), opset=OPSET, sparse=(), name="g"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits),
                          sparse_initializer=list(sparse))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="wbfuzz")
    m.ir_version = 8
    return m


def arr(a, name):
    return numpy_helper.from_array(np.asarray(a), name)


def iter_graphs(m: onnx.ModelProto):
    """Every GraphProto of a model: main graph, subgraphs (nested), training info."""
    def walk(g):
        yield g
        for n in g.node:
            yield from walk_node(n)

    def walk_node(n):
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from walk(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from walk(sg)

    yield from walk(m.graph)
    for ti in m.training_info:
        yield from walk(ti.initialization)
        yield from walk(ti.algorithm)
    for f in m.functions:
        for n in f.node:
            yield from walk_node(n)


def iter_nodes(m: onnx.ModelProto):
    for g in iter_graphs(m):
        yield from g.node
    for f in m.functions:
        yield from f.node


def iter_tensors(m: onnx.ModelProto):
    """Every TensorProto a model carries (initializers, sparse parts, attributes, subgraphs)."""
    def node_tensors(n):
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for st in a.sparse_tensors:
                yield st.values
                yield st.indices

    for g in iter_graphs(m):
        yield from g.initializer
        for st in g.sparse_initializer:
            yield st.values
            yield st.indices
        for n in g.node:
            yield from node_tensors(n)
    for f in m.functions:
        for n in f.node:
            yield from node_tensors(n)


def opset_of(m: onnx.ModelProto, domain: str = "") -> int:
    for o in m.opset_import:
        if o.domain == domain or (domain in ("", "ai.onnx") and o.domain in ("", "ai.onnx")):
            return o.version
    return OPSET


# =========================================================================== sources
def _cache_dir() -> Path:
    d = os.environ.get("WORKBENCH_FUZZ_CACHE")
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "onnx-workbench"


_NODE_CASES: list | None = None


def node_cases() -> list:
    """[(name, model bytes, inputs or None)] for onnx's node test cases, sorted by name.

    onnx ships them as Python code that generates models and data (``collect_testcases``,
    ~10 s); the result is cached in ``~/.cache/onnx-workbench`` (``WORKBENCH_FUZZ_CACHE``) per
    onnx version."""
    global _NODE_CASES
    if _NODE_CASES is not None:
        return _NODE_CASES
    path = _cache_dir() / f"fuzz-node-cases-v2-onnx{onnx.__version__}.pkl"
    try:
        with open(path, "rb") as f:
            _NODE_CASES = pickle.load(f)  # noqa: S301 - written by this function
        return _NODE_CASES
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
        pass
    from onnx.backend.test.case.node import collect_testcases  # noqa: PLC0415

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = []
    for c in sorted(cases, key=lambda c: c.name):
        if c.model is None:
            continue
        inputs = None
        if c.data_sets:
            ins = c.data_sets[0][0]
            names = [v.name for v in c.model.graph.input]

            def ok(x):   # arrays, sequences of arrays (sequence ops), None (empty optionals)
                return (x is None or isinstance(x, np.ndarray)
                        or (isinstance(x, list) and all(isinstance(y, np.ndarray) for y in x)))

            def size(x):
                return sum(size(y) for y in x) if isinstance(x, list) else getattr(x, "nbytes", 0)

            if len(ins) == len(names) and all(ok(x) for x in ins) and size(list(ins)) <= 1 << 20:
                inputs = list(zip(names, ins))
        out.append((c.name, c.model.SerializeToString(), inputs))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        pass
    _NODE_CASES = out
    return out


def _zoo_mlp():
    w1 = arr(np.linspace(-1, 1, 128, dtype=np.float32).reshape(8, 16), "w1")
    b1 = arr(np.zeros(16, np.float32), "b1")
    w2 = arr(np.linspace(1, -1, 64, dtype=np.float32).reshape(16, 4), "w2")
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["z"], name="fc2"),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1, name="softmax")]
    m = mk(nodes, [vi("x", ["N", 8])], [vi("y", ["N", 4])], [w1, b1, w2])
    return m, [("x", np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8))]


def _zoo_cnn():
    w = arr(np.linspace(-0.5, 0.5, 108, dtype=np.float32).reshape(4, 3, 3, 3), "w")
    b = arr(np.zeros(4, np.float32), "b")
    sc, bi = arr(np.ones(4, np.float32), "sc"), arr(np.zeros(4, np.float32), "bi")
    mean, var = arr(np.zeros(4, np.float32), "mean"), arr(np.ones(4, np.float32), "var")
    fw = arr(np.linspace(-1, 1, 640, dtype=np.float32).reshape(64, 10), "fw")
    shape = arr(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "sc", "bi", "mean", "var"], ["bn"],
                              name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2],
                              name="pool"),
             helper.make_node("Reshape", ["p", "shape"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fw"], ["y"], name="fc")]
    m = mk(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 10])],
           [w, b, sc, bi, mean, var, fw, shape])
    return m, [("x", np.linspace(-1, 1, 192, dtype=np.float32).reshape(1, 3, 8, 8))]


def _zoo_if():
    one = arr(np.ones(3, np.float32), "one")
    then = helper.make_graph([helper.make_node("Add", ["x", "one"], ["t"])], "then", [],
                             [vi("t", [3])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["e"])], "else", [],
                              [vi("e", [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other,
                              name="if")]
    m = mk(nodes, [vi("c", [], TensorProto.BOOL), vi("x", [3])], [vi("y", [3])], [one])
    return m, [("c", np.array(True)), ("x", np.arange(3, dtype=np.float32))]


def _zoo_loop():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "inc"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                 vi("v_in", [3])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [3]), vi("scan_out", [3])],
        [arr(np.ones(3, np.float32), "inc")])
    nodes = [helper.make_node("Loop", ["m", "cond", "v0"], ["v", "all"], body=body, name="loop")]
    m = mk(nodes, [vi("v0", [3])], [vi("v", [3]), vi("all", [None, 3])],
           [arr(np.array(4, np.int64), "m"), arr(np.array(True), "cond")])
    return m, [("v0", np.zeros(3, np.float32))]


def _zoo_scan():
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["yi"])],
        "body", [vi("acc_in", [3]), vi("xi", [3])], [vi("acc_out", [3]), vi("yi", [3])])
    nodes = [helper.make_node("Scan", ["acc0", "xs"], ["acc", "ys"], body=body,
                              num_scan_inputs=1, name="scan")]
    m = mk(nodes, [vi("acc0", [3]), vi("xs", [4, 3])], [vi("acc", [3]), vi("ys", [4, 3])])
    return m, [("acc0", np.zeros(3, np.float32)),
               ("xs", np.arange(12, dtype=np.float32).reshape(4, 3))]


def _zoo_attn():
    w = arr(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), "w")
    g_, b_ = arr(np.ones(8, np.float32), "ln_g"), arr(np.zeros(8, np.float32), "ln_b")
    perm_shape = arr(np.array([2, 4, 2, 4], np.int64), "sh")
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["n"], axis=-1,
                              name="ln"),
             helper.make_node("MatMul", ["n", "w"], ["q"], name="proj"),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1], name="tr"),
             helper.make_node("MatMul", ["q", "qt"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["p", "q"], ["o"], name="ctx"),
             helper.make_node("Reshape", ["o", "sh"], ["y"], name="heads")]
    m = mk(nodes, [vi("x", [2, 4, 8])], [vi("y", [2, 4, 2, 4])], [w, g_, b_, perm_shape])
    return m, [("x", np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 4, 8))]


def _zoo_misc():
    nodes = [helper.make_node("Concat", ["x", "x"], ["c"], axis=1, name="concat"),
             helper.make_node("Gather", ["c", "idx"], ["g"], axis=1, name="gather"),
             helper.make_node("Slice", ["g", "st", "en", "ax"], ["s"], name="slice"),
             helper.make_node("Resize", ["s", "", "scales"], ["r"], mode="nearest",
                              name="resize"),
             helper.make_node("Pad", ["r", "pads"], ["p"], name="pad"),
             helper.make_node("ReduceMean", ["p"], ["y"], axes=[1], keepdims=1, name="mean")]
    inits = [arr(np.array([0, 2, 1], np.int64), "idx"), arr(np.array([0], np.int64), "st"),
             arr(np.array([2], np.int64), "en"), arr(np.array([1], np.int64), "ax"),
             arr(np.array([1, 1, 2, 2], np.float32), "scales"),
             arr(np.array([0, 1, 0, 1], np.int64), "pads")]
    m = mk(nodes, [vi("x", [1, 2, 3])], [vi("y", None, rank=3)], inits)
    return m, [("x", np.arange(6, dtype=np.float32).reshape(1, 2, 3))]


ZOO = {"mlp": _zoo_mlp, "cnn": _zoo_cnn, "if": _zoo_if, "loop": _zoo_loop, "scan": _zoo_scan,
       "attn": _zoo_attn, "misc": _zoo_misc}


_SKL_CASES: list | None = None


def skl_cases() -> list:
    """[(name, model bytes, inputs)]: small scikit-learn models converted with skl2onnx (the
    ai.onnx.ml operators: trees, linear models, SVMs, ZipMap...), cached like
    :func:`node_cases`; empty where scikit-learn or skl2onnx is not installed."""
    global _SKL_CASES
    if _SKL_CASES is not None:
        return _SKL_CASES
    try:
        import skl2onnx  # noqa: PLC0415
        import sklearn  # noqa: PLC0415
    except ImportError:
        _SKL_CASES = []
        return _SKL_CASES
    path = _cache_dir() / (f"fuzz-skl-cases-skl{sklearn.__version__}-skl2onnx"
                           f"{skl2onnx.__version__}-onnx{onnx.__version__}.pkl")
    try:
        with open(path, "rb") as f:
            _SKL_CASES = pickle.load(f)  # noqa: S301 - written by this function
        return _SKL_CASES
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
        pass
    from sklearn.cluster import KMeans  # noqa: PLC0415
    from sklearn.decomposition import PCA  # noqa: PLC0415
    from sklearn.ensemble import GradientBoostingRegressor, RandomForestClassifier  # noqa: PLC0415
    from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: PLC0415
    from sklearn.naive_bayes import GaussianNB  # noqa: PLC0415
    from sklearn.neighbors import KNeighborsClassifier  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415
    from sklearn.svm import SVC  # noqa: PLC0415
    from sklearn.tree import DecisionTreeClassifier  # noqa: PLC0415

    def fitted():
        rng = np.random.default_rng(0)
        X = rng.normal(size=(60, 4)).astype(np.float32)
        y = (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1)
        yr = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 1.0
        models = {
            "tree": DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y),
            "forest": RandomForestClassifier(n_estimators=3, max_depth=3,
                                             random_state=0).fit(X, y),
            "gbr": GradientBoostingRegressor(n_estimators=5, max_depth=2,
                                             random_state=0).fit(X, yr),
            "logreg": make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y),
            "linreg": LinearRegression().fit(X, yr),
            "svc": SVC(probability=True, random_state=0).fit(X, y),
            "nb": GaussianNB().fit(X, y),
            "knn": KNeighborsClassifier(n_neighbors=3).fit(X, y),
            "kmeans": KMeans(n_clusters=3, n_init=1, random_state=0).fit(X),
            "pca": PCA(n_components=2).fit(X),
        }
        return X, models

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X, models = fitted()
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, est in models.items():
            try:
                onx = skl2onnx.to_onnx(est, X[:1], target_opset={"": OPSET, "ai.onnx.ml": 3})
            except Exception:  # noqa: BLE001 - a converter that does not take this estimator
                continue
            feed = [(onx.graph.input[0].name, X[:3].copy())]
            out.append((name, onx.SerializeToString(), feed))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:
        pass
    _SKL_CASES = out
    return out


def pick_source(rng: random.Random, node_share: float = 0.7):
    """(label, ModelProto, inputs or None) from the node tests, scikit-learn models converted
    by skl2onnx, or our own small models."""
    if rng.random() < node_share:
        cases = node_cases()
        name, data, inputs = cases[rng.randrange(len(cases))]
        m = onnx.ModelProto()
        m.ParseFromString(data)
        return f"node:{name}", m, inputs
    skl = skl_cases()
    if skl and rng.random() < 0.4:
        name, data, inputs = skl[rng.randrange(len(skl))]
        m = onnx.ModelProto()
        m.ParseFromString(data)
        return f"skl:{name}", m, list(inputs)
    name = rng.choice(sorted(ZOO))
    m, inputs = ZOO[name]()
    return f"zoo:{name}", m, inputs


# =========================================================================== values
INT_EXTREMES = [0, -1, 1, 2, 3, 2**31, -2**31, 2**31 - 1, 2**62, -2**62, 2**63 - 1, -2**63,
                10**6, 65536]
FLOAT_EXTREMES = [0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e38, -1e38, 1e-45,
                  2.0**31, 3.5]
STRING_EXTREMES = [b"", b"\x00", b"garbage", b"\xff\xfe\xfd", b"A" * 5000, b"NOTSET", b"..",
                   b"linear", b"nearest", b"SAME_UPPER", b"constant", b"relu", b"../secret.txt"]
DTYPES = [TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16,
          TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.STRING,
          TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.UINT32,
          TensorProto.UINT64, TensorProto.COMPLEX64, TensorProto.COMPLEX128,
          TensorProto.BFLOAT16]
ODD_DTYPES = [0, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 99, -1, 2**31 - 1]


def _ints(rng):
    k = rng.random()
    if k < 0.15:
        return []
    if k < 0.25:
        return [rng.choice(INT_EXTREMES)] * rng.choice([100, 10000, 100000])
    return [rng.choice(INT_EXTREMES) for _ in range(rng.randint(1, 8))]


def _floats(rng):
    k = rng.random()
    if k < 0.15:
        return []
    if k < 0.25:
        return [rng.choice(FLOAT_EXTREMES)] * rng.choice([100, 10000])
    return [rng.choice(FLOAT_EXTREMES) for _ in range(rng.randint(1, 8))]


def _rand_tensor(rng, name="t"):
    k = rng.random()
    if k < 0.2:  # claims many elements, holds none
        t = TensorProto(name=name, data_type=TensorProto.FLOAT,
                        dims=[rng.choice([2**31, 2**40, 2**62])])
        return t
    if k < 0.3:
        return TensorProto(name=name, data_type=rng.choice(ODD_DTYPES), dims=[1])
    if k < 0.4:
        return helper.make_tensor(name, TensorProto.STRING, [2], [b"a", b"\xff"])
    shape = [rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(0, 3))]
    dt = rng.choice([np.float32, np.int64, np.int32, np.uint8, np.bool_, np.float64])
    a = (np.arange(int(np.prod(shape)) if shape else 1) % 3).astype(dt).reshape(shape)
    return numpy_helper.from_array(a, name)


def _rand_graph(rng):
    k = rng.random()
    if k < 0.3:
        return helper.make_graph([], "empty", [], [])
    if k < 0.6:
        return helper.make_graph([helper.make_node("Identity", ["nowhere"], ["o"])], "dangle",
                                 [], [vi("o", [1])])
    return helper.make_graph([helper.make_node("Constant", [], ["o"],
                                               value=arr(np.ones(1, np.float32), "c"))],
                             "const", [], [vi("o", [1])])


def make_attr(rng, name: str, atype) -> AttributeProto:
    """An AttributeProto of type ``atype`` (an AttributeProto enum value) with an extreme value."""
    a = AttributeProto(name=name, type=atype)
    if atype == AttributeProto.INT:
        a.i = rng.choice(INT_EXTREMES)
    elif atype == AttributeProto.FLOAT:
        a.f = rng.choice(FLOAT_EXTREMES)
    elif atype == AttributeProto.STRING:
        a.s = rng.choice(STRING_EXTREMES)
    elif atype == AttributeProto.INTS:
        a.ints.extend(_ints(rng))
    elif atype == AttributeProto.FLOATS:
        a.floats.extend(_floats(rng))
    elif atype == AttributeProto.STRINGS:
        a.strings.extend([rng.choice(STRING_EXTREMES) for _ in range(rng.randint(0, 4))])
    elif atype == AttributeProto.TENSOR:
        a.t.CopyFrom(_rand_tensor(rng))
    elif atype == AttributeProto.TENSORS:
        a.tensors.extend([_rand_tensor(rng) for _ in range(rng.randint(0, 3))])
    elif atype == AttributeProto.GRAPH:
        a.g.CopyFrom(_rand_graph(rng))
    elif atype == AttributeProto.GRAPHS:
        a.graphs.extend([_rand_graph(rng) for _ in range(rng.randint(0, 2))])
    elif atype == AttributeProto.SPARSE_TENSOR:
        vals = _rand_tensor(rng, "v")
        idx = arr(np.array([rng.choice([0, 1, -1, 2**40])], np.int64), "i")
        a.sparse_tensor.CopyFrom(helper.make_sparse_tensor(vals, idx, [rng.choice([1, 2, 0])]))
    else:  # TYPE_PROTO and anything else: the field left empty
        pass
    return a


ATTR_TYPES = [AttributeProto.INT, AttributeProto.FLOAT, AttributeProto.STRING,
              AttributeProto.INTS, AttributeProto.FLOATS, AttributeProto.STRINGS,
              AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.GRAPH,
              AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR, AttributeProto.TYPE_PROTO]


def _schema_attrs(n: onnx.NodeProto, opset: int) -> dict:
    try:
        s = onnx.defs.get_schema(n.op_type, max_inclusive_version=max(1, opset),
                                 domain=n.domain or "")
    except Exception:  # noqa: BLE001 - unknown op or domain
        return {}
    return {k: int(v.type.value) for k, v in s.attributes.items()}


def _set_attr(n: onnx.NodeProto, a: AttributeProto):
    keep = [x for x in n.attribute if x.name != a.name]
    del n.attribute[:]
    n.attribute.extend(keep)
    n.attribute.append(a)


# =========================================================================== mutations
def mutate_attr(m, rng) -> str:
    nodes = list(iter_nodes(m))
    if not nodes:
        return mutate_meta(m, rng)
    notes = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        n = rng.choice(nodes)
        schema = _schema_attrs(n, opset_of(m, n.domain))
        names = sorted(set(schema) | {a.name for a in n.attribute})
        if not names:
            names = ["axis", "bogus"]
        name = rng.choice(names)
        typ = schema.get(name)
        if typ is None:
            typ = next((a.type for a in n.attribute if a.name == name), AttributeProto.INT)
        k = rng.random()
        if k < 0.6:
            a = make_attr(rng, name, typ)
            what = "extreme"
        elif k < 0.8:
            a = make_attr(rng, name, rng.choice([t for t in ATTR_TYPES if t != typ]))
            what = "wrong type"
        elif k < 0.9:  # declared type and filled field disagree
            a = make_attr(rng, name, rng.choice(ATTR_TYPES))
            a.type = typ
            what = "type/field mismatch"
        else:
            keep = [x for x in n.attribute if x.name != name]
            del n.attribute[:]
            n.attribute.extend(keep)
            notes.append(f"{n.op_type}.{name} removed")
            continue
        _set_attr(n, a)
        val = helper.get_attribute_value(a) if a.type != AttributeProto.TYPE_PROTO else None
        if isinstance(val, list) and len(val) > 8:
            val = f"[{val[0]!r}]*{len(val)}"
        notes.append(f"{n.op_type}.{name}={str(val)[:60]} ({what})")
    return "; ".join(notes)


def _all_value_names(g):
    names = [v.name for v in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        names.extend(o for o in n.output if o)
    return names


def _mut_tensor_type(rng, tt) -> str:
    k = rng.random()
    if k < 0.3:
        tt.elem_type = rng.choice(DTYPES + ODD_DTYPES)
        return f"elem_type={tt.elem_type}"
    if k < 0.5:
        if tt.HasField("shape") and tt.shape.dim and rng.random() < 0.5:
            del tt.shape.dim[-1]
            return "rank-1"
        tt.shape.dim.add().dim_value = rng.choice([1, 2, 3])
        return "rank+1"
    if k < 0.8 and tt.HasField("shape") and tt.shape.dim:
        d = rng.choice(list(tt.shape.dim))
        v = rng.choice([0, -1, 2**31, 2**62, "N", ""])
        if isinstance(v, str):
            d.dim_param = v
        else:
            d.dim_value = v
        return f"dim={v!r}"
    if k < 0.9:
        tt.ClearField("shape")
        return "shape cleared"
    tt.shape.Clear()
    return "rank 0"


def _graph_mutations(m, g, rng):
    ops = ["Relu", "Add", "Conv", "Loop", "If", "Scan", "Reshape", "Gather", "Split", "Concat",
           "NonExistentOp", "Identity", "MatMul", "Softmax", "Resize", "Einsum", "Constant"]

    def input_type():
        vs = list(g.input) + list(g.output)
        if not vs:
            return None
        v = rng.choice(vs)
        if v.type.HasField("tensor_type"):
            return f"{v.name}: " + _mut_tensor_type(rng, v.type.tensor_type)
        v.type.Clear()
        return f"{v.name}: type cleared"

    def input_nontensor():
        if not g.input:
            return None
        v = rng.choice(list(g.input))
        t = v.type
        elem = t.tensor_type.elem_type or TensorProto.FLOAT
        t.Clear()
        if rng.random() < 0.5:
            t.sequence_type.elem_type.tensor_type.elem_type = elem
            return f"{v.name}: sequence type"
        t.optional_type.elem_type.tensor_type.elem_type = elem
        return f"{v.name}: optional type"

    def init_change():
        if not g.initializer:
            return None
        t = rng.choice(list(g.initializer))
        k = rng.random()
        if k < 0.4:
            t.data_type = rng.choice(DTYPES + ODD_DTYPES)
            return f"initializer {t.name}: data_type={t.data_type}"
        if k < 0.8:
            if t.dims and rng.random() < 0.5:
                t.dims[rng.randrange(len(t.dims))] = rng.choice([0, -1, 2, 2**31, 2**62])
            else:
                t.dims.append(rng.choice([1, 2]))
            return f"initializer {t.name}: dims={list(t.dims)}"
        t.name = t.name + "_renamed"
        return f"initializer {t.name}: renamed"

    def init_replace():
        """A valid tensor of another shape or dtype in place of an initializer (the data is
        consistent, so it gets past the loader into the passes and kernels)."""
        if not g.initializer:
            return None
        t = rng.choice(list(g.initializer))
        try:
            a = numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001
            return None
        shape = list(a.shape)
        k = rng.random()
        if k < 0.3 and shape:
            shape[rng.randrange(len(shape))] = rng.choice([0, 1, 2, 3, 5])
        elif k < 0.5:
            shape.append(rng.choice([1, 2]))
        elif k < 0.7 and shape:
            shape.pop(rng.randrange(len(shape)))
        dt = a.dtype if rng.random() < 0.6 else np.dtype(rng.choice(
            [np.float32, np.float64, np.int64, np.int32, np.float16, np.bool_, np.uint8]))
        n = int(np.prod(shape)) if shape else 1
        if n > 1 << 16:
            return None
        b = (np.arange(n) % 5 - 2).astype(dt).reshape(shape)
        t.CopyFrom(numpy_helper.from_array(b, t.name))
        return f"initializer {t.name}: valid {dt} {shape} (was {a.dtype} {list(a.shape)})"

    def remove_io():
        lst = g.input if (rng.random() < 0.5 and g.input) else g.output
        if not lst:
            return None
        i = rng.randrange(len(lst))
        name = lst[i].name
        del lst[i]
        return f"removed graph input/output {name}"

    def dup_io():
        lst = g.input if (rng.random() < 0.5 and g.input) else g.output
        if not lst:
            return None
        v = rng.choice(list(lst))
        lst.append(copy.deepcopy(v))
        return f"duplicated graph input/output {v.name}"

    def rename_io():
        lst = g.input if (rng.random() < 0.5 and g.input) else g.output
        if not lst:
            return None
        v = rng.choice(list(lst))
        old = v.name
        v.name = rng.choice(["", old + "_x", "\x00", " ", "y" if old != "y" else "x"])
        return f"renamed graph input/output {old!r} -> {v.name!r}"

    def dangling():
        nodes = [n for n in g.node if n.input]
        if not nodes:
            return None
        n = rng.choice(nodes)
        i = rng.randrange(len(n.input))
        n.input[i] = rng.choice(["nowhere", "", "\x00"])
        return f"{n.op_type} input {i} -> {n.input[i]!r}"

    def cycle():
        if not g.node:
            return None
        j = rng.randrange(len(g.node))
        k = rng.randrange(j, len(g.node))
        n, src = g.node[j], g.node[k]
        outs = [o for o in src.output if o]
        if not n.input or not outs:
            return None
        n.input[rng.randrange(len(n.input))] = rng.choice(outs)
        return f"cycle: node {j} ({n.op_type}) reads node {k}'s output"

    def dup_node():
        if not g.node:
            return None
        n = rng.choice(list(g.node))
        g.node.append(copy.deepcopy(n))
        return f"duplicated node {n.op_type}"

    def remove_node():
        if not g.node:
            return None
        i = rng.randrange(len(g.node))
        op = g.node[i].op_type
        del g.node[i]
        return f"removed node {op}"

    def reorder():
        if len(g.node) < 2:
            return None
        nodes = list(g.node)
        nodes.reverse()
        del g.node[:]
        g.node.extend(nodes)
        return "nodes reversed"

    def op_swap():
        if not g.node:
            return None
        n = rng.choice(list(g.node))
        old = n.op_type
        n.op_type = rng.choice(ops)
        return f"op {old} -> {n.op_type}"

    def domain_swap():
        if not g.node:
            return None
        n = rng.choice(list(g.node))
        n.domain = rng.choice(["com.unknown", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview"])
        return f"{n.op_type} domain -> {n.domain}"

    def io_count():
        if not g.node:
            return None
        n = rng.choice(list(g.node))
        names = _all_value_names(g) or ["x"]
        k = rng.random()
        if k < 0.4:
            n.input.extend(rng.choice(names) for _ in range(rng.randint(1, 6)))
            return f"{n.op_type}: extra inputs"
        if k < 0.7 and n.input:
            del n.input[-1]
            return f"{n.op_type}: last input dropped"
        if k < 0.85:
            n.output.append(f"extra_out_{rng.randint(0, 9)}")
            return f"{n.op_type}: extra output"
        if n.output:
            n.output[0] = ""
            return f"{n.op_type}: first output unnamed"
        return None

    def output_from_input():
        if not g.output or not g.input:
            return None
        g.output[0].name = g.input[0].name
        return "graph output is a graph input"

    def bogus_value_info():
        names = _all_value_names(g) or ["x"]
        v = vi(rng.choice(names), [rng.choice([0, 2**31, -1])], rng.choice(DTYPES + ODD_DTYPES))
        g.value_info.append(v)
        return f"value_info {v.name} bogus"

    return [input_type, input_nontensor, init_change, init_replace, init_replace, remove_io,
            dup_io, rename_io, dangling,
            cycle, dup_node, remove_node, reorder, op_swap, domain_swap, io_count,
            output_from_input, bogus_value_info]


def mutate_graph(m, rng) -> str:
    notes = []
    graphs = list(iter_graphs(m))
    for _ in range(rng.choice([1, 1, 2, 3])):
        g = graphs[0] if rng.random() < 0.7 else rng.choice(graphs)
        muts = _graph_mutations(m, g, rng)
        for _try in range(4):
            note = rng.choice(muts)()
            if note:
                notes.append(note if g is m.graph else f"[{g.name}] {note}")
                break
    return "; ".join(notes) or "no applicable graph mutation"


def mutate_meta(m, rng) -> str:
    k = rng.random()
    if k < 0.25:
        m.ir_version = rng.choice([0, -1, 1, 2, 3, 4, 6, 7, 9, 10, 11, 12, 99, 2**31, 2**62])
        return f"ir_version={m.ir_version}"
    if k < 0.5:
        v = rng.choice([0, -1, 1, 5, 6, 7, 21, 22, 23, 24, 25, 99, 2**31, 2**62])
        found = False
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = v
                found = True
        if not found:
            m.opset_import.add(domain="", version=v)
        return f"default opset={v}"
    if k < 0.6:
        del m.opset_import[:]
        return "no opset_import"
    if k < 0.7:
        m.opset_import.add(domain="", version=rng.choice([1, 7, 13, 21]))
        return "default domain imported twice"
    if k < 0.75:
        m.opset_import.add(domain=rng.choice(["com.unknown", "ai.onnx.ml", "\x00"]),
                           version=rng.choice([-1, 1, 2**40]))
        return "extra domain import"
    if k < 0.85:  # a model-local function that calls itself
        op = rng.choice(["Rec", "Relu"])
        dom = rng.choice(["local", ""])
        f = helper.make_function(dom, op, ["a"], ["b"],
                                 [helper.make_node(op, ["a"], ["b"], domain=dom)],
                                 [helper.make_opsetid("", OPSET)])
        m.functions.append(f)
        if dom:
            m.opset_import.add(domain=dom, version=1)
        if m.graph.node:
            n = m.graph.node[0]
            n.op_type, n.domain = op, dom
            del n.input[1:]
            del n.output[1:]
        return f"recursive function {dom}::{op}"
    if k < 0.92:  # a function with a broken body
        f = helper.make_function("local", "Broken", ["a"], ["b"],
                                 [helper.make_node("Add", ["a", "missing"], ["b"])],
                                 [helper.make_opsetid("", rng.choice([OPSET, 0, 99]))])
        m.functions.append(f)
        m.opset_import.add(domain="local", version=1)
        if m.graph.node:
            m.graph.node[0].op_type, m.graph.node[0].domain = "Broken", "local"
        return "function with a dangling body"
    m.metadata_props.add(key="k" * rng.choice([1, 10000]), value="\x00" * 100)
    m.producer_name = "\xff" if rng.random() < 0.5 else "x" * 10000
    return "odd metadata"


def _tensor_candidates(m):
    return [t for t in iter_tensors(m) if t.dims or t.raw_data or t.float_data
            or t.int64_data or t.int32_data]


def mutate_rawdata(m, rng, inputs) -> str:
    g = m.graph
    # make data-carrying initializers of the given inputs (the node tests have few weights)
    if inputs and rng.random() < 0.6:
        name, value = rng.choice(inputs)
        if isinstance(value, np.ndarray) and value.dtype != object and value.dtype.isnative:
            keep = [v for v in g.input if v.name != name]
            del g.input[:]
            g.input.extend(keep)
            g.initializer.append(numpy_helper.from_array(value, name))
    cands = _tensor_candidates(m)
    if not cands:
        t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "extra")
        g.initializer.append(t)
        g.node.append(helper.make_node("Identity", ["extra"], ["extra_out"]))
        g.output.append(vi("extra_out", [2, 3]))
        cands = [g.initializer[-1]]
    t = rng.choice(cands)
    if not t.raw_data and t.data_type not in (TensorProto.STRING, 0):
        try:
            a = numpy_helper.to_array(t)
            nt = numpy_helper.from_array(a, t.name)
            t.CopyFrom(nt)
        except Exception:  # noqa: BLE001 - already odd
            pass
    raw = bytes(t.raw_data)
    k = rng.random()
    if k < 0.2:
        cut = rng.randrange(len(raw)) if raw else 0
        t.raw_data = raw[:cut]
        note = f"raw_data {len(raw)} -> {cut} bytes"
    elif k < 0.35:
        t.raw_data = raw + bytes(rng.randrange(1, 64))
        note = "raw_data longer"
    elif k < 0.45:
        t.raw_data = raw[:-1] if raw else b"\x01"
        note = "raw_data one byte short"
    elif k < 0.6:
        t.dims.append(rng.choice([2**31, 2**40, 2**62, 0, -1]))
        note = f"dims={list(t.dims)} with the same raw_data"
    elif k < 0.7:
        t.data_type = rng.choice(DTYPES + ODD_DTYPES)
        note = f"data_type={t.data_type} with the same raw_data"
    elif k < 0.8:
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * rng.choice([0, 1, 3]))
        t.int64_data.extend([2**62] * rng.choice([0, 2]))
        note = "typed fields with a wrong count"
    elif k < 0.88:
        t.data_type = TensorProto.STRING
        t.string_data.extend([b"\xff"] * rng.choice([0, 1, 5]))
        note = "string tensor with raw_data"
    elif k < 0.94:
        t.segment.begin, t.segment.end = rng.choice([(0, 2**40), (-5, 3), (3, 1)])
        note = "segment set"
    else:
        t.dims[:] = [rng.choice([2**31, 2**33])]
        t.data_type = rng.choice([TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1]
                                 if hasattr(TensorProto, "FLOAT4E2M1")
                                 else [TensorProto.INT4, TensorProto.UINT4])
        note = "packed 4-bit tensor claiming 2**31+ elements"
    return f"tensor {t.name!r}: {note}"


def _model_strings(m: onnx.ModelProto) -> list[str]:
    """Names and other strings a model holds (to corrupt in place in the serialized bytes)."""
    out = {m.producer_name, m.domain}
    out.update(o.domain for o in m.opset_import)
    for g in iter_graphs(m):
        out.add(g.name)
        for v in list(g.input) + list(g.output) + list(g.value_info):
            out.add(v.name)
            if v.type.HasField("tensor_type"):
                out.update(d.dim_param for d in v.type.tensor_type.shape.dim)
        for n in g.node:
            out.update([n.name, n.op_type, n.domain, *n.input, *n.output])
            out.update(a.name for a in n.attribute)
            out.update(a.s.decode("latin-1") for a in n.attribute
                       if a.type == AttributeProto.STRING)
    for t in iter_tensors(m):
        out.add(t.name)
    for f in m.functions:
        out.update([f.name, f.domain])
    return sorted(x for x in out if x and len(x) >= 1)


def corrupt_utf8(data: bytes, m: onnx.ModelProto, rng) -> tuple[bytes, str]:
    """Replace one byte of a name with a byte that makes it invalid UTF-8 (same length, so the
    protobuf structure stays valid and the file parses)."""
    names = _model_strings(m)
    rng.shuffle(names)
    for name in names:
        enc = name.encode("utf-8", "surrogatepass")
        i = data.find(enc)
        if i < 0:
            continue
        j = i + rng.randrange(len(enc))
        b = bytearray(data)
        b[j] = rng.choice([0xff, 0x80, 0xc0, 0xfe, 0xed])
        return bytes(b), f"invalid UTF-8 in {name[:40]!r}"
    return data, "no string to corrupt"


def mutate_bytes(data: bytes, rng) -> tuple[bytes, str]:
    b = bytearray(data)
    notes = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        k = rng.random()
        if k < 0.3 and b:
            cut = rng.randrange(len(b))
            del b[cut:]
            notes.append(f"truncated at {cut}")
        elif k < 0.6 and b:
            nflip = rng.choice([1, 1, 2, 4, 8, 16])
            for _ in range(nflip):
                i = rng.randrange(len(b))
                b[i] ^= rng.randrange(1, 256)
            notes.append(f"{nflip} bytes flipped")
        elif k < 0.7:
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            notes.append("random bytes inserted")
        elif k < 0.78 and len(b) > 4:
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randint(1, 64))
            b[i:i] = b[i:j] * rng.choice([1, 2, 10])
            notes.append("chunk duplicated")
        elif k < 0.84 and b:
            i = rng.randrange(len(b))
            b[i] = rng.choice([0x08, 0x10, 0x12, 0x1a, 0x22, 0x3a, 0x42, 0xff])
            if i + 1 < len(b):
                b[i + 1] = rng.choice([0xff, 0x7f, 0x80, 0x00])
            notes.append("tag/length byte replaced")
        elif k < 0.9:
            b = bytearray(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 100, 1000])))
            notes.append(f"random file of {len(b)} bytes")
            break
        elif k < 0.95:
            # a length varint claiming a huge field
            i = rng.randrange(len(b) + 1)
            b[i:i] = b"\x3a\xff\xff\xff\xff\x0f"
            notes.append("huge length varint inserted")
        else:
            b = bytearray(rng.choice([b"", b"ONNX", b"\x00" * 64, b"\x08" * 1000,
                                      b"not a model\n"]))
            notes.append("non-model file")
            break
    return bytes(b), "; ".join(notes)


# =========================================================================== generators
def _mutation_case(gen: str, seed: int, mutate) -> Case:
    rng = random.Random(f"{gen}:{seed}")
    label, m, inputs = pick_source(rng)
    note = mutate(m, rng, inputs)
    feed_inputs = inputs if (inputs is not None and rng.random() < 0.7) else None
    # a third with onnx's checker off (prepare(check=False)): the engine's own validation
    feed = "path_nocheck" if rng.random() < 0.35 else "path"
    return Case(gen, seed, m.SerializeToString(), inputs=feed_inputs, feed=feed,
                note=f"{label}: {note}" + (" (check=False)" if feed == "path_nocheck" else ""))


def _extreme_array(rng, a: np.ndarray) -> tuple[object, str]:
    """A hostile replacement for input array ``a``."""
    k = rng.random()
    if k < 0.3 and a.size and a.dtype.kind in "iuf":
        b = a.copy()
        if a.dtype.kind == "f":
            v = rng.choice([np.nan, np.inf, -np.inf, 1e38, -0.0, np.finfo(a.dtype).max])
        else:
            info = np.iinfo(a.dtype)
            v = rng.choice([info.max, info.min, 0, -1 if info.min < 0 else 0,
                            min(info.max, 2**31), min(info.max, 2**62)])
        if rng.random() < 0.5:
            b.flat[rng.randrange(b.size)] = v
        else:
            b[...] = v
        return b, f"value {v!r}"
    if k < 0.5:
        shape = list(a.shape)
        j = rng.random()
        if j < 0.3 or not shape:
            shape.append(rng.choice([0, 1, 2]))
        elif j < 0.5:
            shape.pop(rng.randrange(len(shape)))
        elif j < 0.8:
            shape[rng.randrange(len(shape))] = rng.choice([0, 1, 5, 300])
        else:
            shape = []
        b = np.resize(a, shape) if a.size and int(np.prod(shape)) else np.zeros(shape, a.dtype)
        return b, f"shape {a.shape} -> {tuple(shape)}"
    if k < 0.65:
        dt = rng.choice([np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_,
                         np.float16, np.complex64, object, np.str_])
        try:
            return a.astype(dt), f"dtype {a.dtype} -> {np.dtype(dt)}"
        except (TypeError, ValueError):
            return np.zeros(a.shape, dt), f"dtype {a.dtype} -> {np.dtype(dt)} (zeros)"
    if k < 0.75 and a.dtype.kind in "iuf" and a.dtype.itemsize > 1:
        return a.astype(a.dtype.newbyteorder(">")), "big-endian"
    if k < 0.82 and a.ndim >= 2:
        return np.asfortranarray(a).T.T[..., ::-1], "non-contiguous view"
    if k < 0.9:
        return rng.choice([None, [1, 2, 3], "text", 3.5, {"a": 1}]), "not an array"
    b = a.copy()
    b.setflags(write=False)
    return b, "read-only"


def gen_mut_inputs(seed: int) -> Case:
    """Node tests and our models, run with hostile inputs (values, shapes, dtypes, types)."""
    rng = random.Random(f"mut_inputs:{seed}")
    for _ in range(20):
        label, m, inputs = pick_source(rng)
        if inputs:
            break
    inputs = [(k, v) for k, v in (inputs or [])]
    notes = []
    k = rng.random()
    if k < 0.08 and inputs:
        name = inputs.pop(rng.randrange(len(inputs)))[0]
        notes.append(f"input {name} missing")
    elif k < 0.14:
        inputs.append((rng.choice(["unknown", inputs[0][0] if inputs else "x"]),
                       np.zeros(2, np.float32)))
        notes.append("an extra input")
    elif inputs:
        for _ in range(rng.choice([1, 1, 2])):
            i = rng.randrange(len(inputs))
            name, a = inputs[i]
            if isinstance(a, np.ndarray):
                b, what = _extreme_array(rng, a)
                inputs[i] = (name, b)
                notes.append(f"{name}: {what}")
            elif isinstance(a, list) and all(isinstance(x, np.ndarray) for x in a):
                # a sequence input
                k = rng.random()
                if k < 0.25:
                    inputs[i] = (name, [])
                    notes.append(f"{name}: empty sequence")
                elif k < 0.5 and a:
                    inputs[i] = (name, a + [a[0].astype(np.float64 if a[0].dtype != np.float64
                                                        else np.int64)])
                    notes.append(f"{name}: sequence of mixed dtypes")
                elif k < 0.75 and a:
                    inputs[i] = (name, a + [np.zeros([3] * (a[0].ndim + 1), a[0].dtype)])
                    notes.append(f"{name}: sequence of mixed ranks")
                else:
                    inputs[i] = (name, rng.choice([None, np.zeros(2, np.float32)]))
                    notes.append(f"{name}: not a sequence")
            elif a is None:
                inputs[i] = (name, np.zeros(rng.choice([0, 2]), np.float32))
                notes.append(f"{name}: an array for an empty optional")
    return Case("mut_inputs", seed, m.SerializeToString(), inputs=inputs,
                note=f"{label}: {'; '.join(notes) or 'as given'}")


def gen_mut_attr(seed: int) -> Case:
    return _mutation_case("mut_attr", seed, lambda m, rng, ins: mutate_attr(m, rng))


def gen_mut_graph(seed: int) -> Case:
    return _mutation_case("mut_graph", seed, lambda m, rng, ins: mutate_graph(m, rng))


def gen_mut_meta(seed: int) -> Case:
    return _mutation_case("mut_meta", seed, lambda m, rng, ins: mutate_meta(m, rng))


def gen_mut_rawdata(seed: int) -> Case:
    return _mutation_case("mut_rawdata", seed, mutate_rawdata)


def gen_mut_bytes(seed: int) -> Case:
    rng = random.Random(f"mut_bytes:{seed}")
    label, m, inputs = pick_source(rng, node_share=0.6)
    if rng.random() < 0.3:
        data, note = corrupt_utf8(m.SerializeToString(), m, rng)
    else:
        data, note = mutate_bytes(m.SerializeToString(), rng)
    return Case("mut_bytes", seed, data, inputs=inputs, note=f"{label}: {note}")


def gen_mut_mix(seed: int) -> Case:
    """Several mutations at once (attributes, graph, metadata, tensor data, inputs)."""
    rng = random.Random(f"mut_mix:{seed}")
    label, m, inputs = pick_source(rng)
    notes = []
    for _ in range(rng.randint(2, 4)):
        k = rng.random()
        try:
            if k < 0.35:
                notes.append(mutate_attr(m, rng))
            elif k < 0.65:
                notes.append(mutate_graph(m, rng))
            elif k < 0.75:
                notes.append(mutate_meta(m, rng))
            elif k < 0.85:
                notes.append(mutate_rawdata(m, rng, inputs))
            elif inputs:
                i = rng.randrange(len(inputs))
                inputs = list(inputs)
                name, a = inputs[i]
                if not isinstance(a, np.ndarray):
                    continue
                b, what = _extreme_array(rng, a)
                inputs[i] = (name, b)
                notes.append(f"input {name}: {what}")
        except (ValueError, TypeError, KeyError, IndexError) as e:
            # an earlier mutation left something the next cannot work on: skip it
            notes.append(f"(mutation skipped: {type(e).__name__})")
    feed = "path_nocheck" if rng.random() < 0.5 else "path"
    return Case("mut_mix", seed, m.SerializeToString(), inputs=inputs, feed=feed,
                note=f"{label}: {'; '.join(notes)}" + (" (check=False)" if feed != "path" else ""))


# --------------------------------------------------------------------------- external data
N_EXT = 7          # float32 elements of the external tensor (28 bytes)
# a harmless file inside the folder: int64 0..6 (sparse indices) then float32 values
DATA_BIN = np.arange(N_EXT, dtype=np.int64).tobytes() + np.arange(1, 50, dtype=np.float32).tobytes()


def ext_tensor(name, entries, n=N_EXT, dtype=TensorProto.FLOAT):
    """A [n] tensor whose data is external, described by ``entries`` [(key, value)]."""
    np_dt = helper.tensor_dtype_to_np_dtype(dtype)
    t = numpy_helper.from_array(np.zeros(n, np_dt), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _entries(loc, nbytes, offset=0):
    return [("location", loc), ("offset", str(offset)), ("length", str(nbytes))]


def _attack(name: str, nbytes: int):
    """(entries, files, note) for one attack on a tensor of ``nbytes`` bytes."""
    E = _entries
    secret = "secret.txt"
    table = {
        "control": (E("data.bin", nbytes), [("data.bin", "file", DATA_BIN)],
                    "valid data inside the folder"),
        "control_no_keys": ([("location", "data.bin")], [("data.bin", "file", DATA_BIN)],
                            "valid, location only"),
        "parent": (E("../" + secret, nbytes), [], "../secret.txt"),
        "abs_tmp": (E("@TMP@/" + secret, nbytes), [], "absolute /tmp path"),
        "abs_parent": (E("@PARENT@/" + secret, nbytes), [], "absolute path to the parent"),
        "abs_cwd": (E("@CWD@/" + secret, nbytes), [], "absolute path to the cwd"),
        "abs_dotdot": (E("@MODEL_DIR@/../" + secret, nbytes), [], "absolute path with .."),
        "sub_dotdot": (E("sub/../../" + secret, nbytes), [("sub", "dir", None)],
                       "sub/../../secret.txt"),
        "dot_slash_dotdot": (E("./../" + secret, nbytes), [], "./../secret.txt"),
        "backslash": (E("..\\" + secret, nbytes), [], "..\\secret.txt"),
        "file_url": (E("file://@TMP@/" + secret, nbytes), [], "file:// URL"),
        "tilde": (E("~/" + secret, nbytes), [], "~/secret.txt"),
        "cwd_name": (E(secret, nbytes), [], "bare name of the cwd's file"),
        "symlink_parent": (E("link.bin", nbytes), [("link.bin", "symlink", "@PARENT@/" + secret)],
                           "symlink to the parent's file"),
        "symlink_tmp": (E("link.bin", nbytes), [("link.bin", "symlink", "@TMP@/" + secret)],
                        "symlink to /tmp"),
        "symlink_relative": (E("link.bin", nbytes), [("link.bin", "symlink", "../" + secret)],
                             "relative symlink leaving the folder"),
        "symlink_dir": (E("d/" + secret, nbytes), [("d", "symlink", "@PARENT@")],
                        "symlinked folder"),
        "symlink_chain": (E("a.bin", nbytes), [("a.bin", "symlink", "b.bin"),
                                               ("b.bin", "symlink", "@CWD@/" + secret)],
                          "symlink to a symlink leaving the folder"),
        "symlink_devzero": (E("z.bin", nbytes), [("z.bin", "symlink", "/dev/zero")],
                            "symlink to /dev/zero"),
        "symlink_loop": (E("l1.bin", nbytes), [("l1.bin", "symlink", "l2.bin"),
                                               ("l2.bin", "symlink", "l1.bin")],
                         "symlink loop"),
        "proc_self": (E("/proc/self/environ", nbytes), [], "/proc/self/environ"),
        "fifo": (E("fifo.bin", nbytes), [("fifo.bin", "fifo", None)], "a FIFO (would block)"),
        "directory": (E("dir.bin", nbytes), [("dir.bin", "dir", None)], "a directory"),
        "dot": (E(".", nbytes), [], "location ."),
        "empty_location": (E("", nbytes), [], "empty location"),
        "no_location": ([("offset", "0"), ("length", str(nbytes))], [], "no location key"),
        "missing_file": (E("nothere.bin", nbytes), [], "file does not exist"),
        "nul_location": (E("data.bin\x00../" + secret, nbytes), [("data.bin", "file", DATA_BIN)],
                         "NUL byte in location"),
        "nul_offset": ([("location", "data.bin"), ("offset", "0\x00"), ("length", str(nbytes))],
                       [("data.bin", "file", DATA_BIN)], "NUL byte in offset"),
        "neg_offset": ([("location", "data.bin"), ("offset", "-4"), ("length", str(nbytes))],
                       [("data.bin", "file", DATA_BIN)], "offset=-4"),
        "odd_offsets": ([("location", "data.bin"), ("offset", "+4"), ("length", " 28")],
                        [("data.bin", "file", DATA_BIN)], "offset=+4, length=' 28'"),
        "hex_offset": ([("location", "data.bin"), ("offset", "0x10"), ("length", "2.8e1")],
                       [("data.bin", "file", DATA_BIN)], "offset=0x10, length=2.8e1"),
        "huge_offset": ([("location", "data.bin"), ("offset", str(2**63)),
                         ("length", str(nbytes))], [("data.bin", "file", DATA_BIN)],
                        "offset=2**63"),
        "length_abc": ([("location", "data.bin"), ("offset", "0"), ("length", "abc")],
                       [("data.bin", "file", DATA_BIN)], "length=abc"),
        "length_2_33": ([("location", "data.bin"), ("offset", "0"), ("length", str(2**33))],
                        [("data.bin", "file", DATA_BIN)], "length=2**33"),
        "length_neg": ([("location", "data.bin"), ("offset", "0"), ("length", "-28")],
                       [("data.bin", "file", DATA_BIN)], "length=-28"),
        "dup_location": ([("location", "data.bin"), ("location", "../" + secret),
                          ("offset", "0"), ("length", str(nbytes))],
                         [("data.bin", "file", DATA_BIN)], "location twice"),
        "dup_offset": ([("location", "data.bin"), ("offset", "0"), ("offset", "4"),
                        ("length", str(nbytes))], [("data.bin", "file", DATA_BIN)],
                       "offset twice"),
        "unknown_key": (E("data.bin", nbytes) + [("basepath", "/")],
                        [("data.bin", "file", DATA_BIN)], "unknown key"),
        "beyond": (E("data.bin", nbytes, offset=len(DATA_BIN) - 4),
                   [("data.bin", "file", DATA_BIN)], "offset+length beyond the file"),
        "length_mismatch": (E("data.bin", nbytes + 4), [("data.bin", "file", DATA_BIN)],
                            "length != dims x dtype"),
        "short_file": (E("short.bin", nbytes), [("short.bin", "file", b"\x01\x02")],
                       "file shorter than the tensor"),
        "checksum_garbage": (E("data.bin", nbytes) + [("checksum", "zz\x00not-a-digest")],
                             [("data.bin", "file", DATA_BIN)], "checksum garbage"),
        "dims_2_40": (E("data.bin", nbytes), [("data.bin", "file", DATA_BIN)],
                      "dims claim 2**40 elements"),
    }
    return table[name]


EXT_ATTACKS = ["control", "control_no_keys", "parent", "abs_tmp", "abs_parent", "abs_cwd",
               "abs_dotdot", "sub_dotdot", "dot_slash_dotdot", "backslash", "file_url", "tilde",
               "cwd_name", "symlink_parent", "symlink_tmp", "symlink_relative", "symlink_dir",
               "symlink_chain", "symlink_devzero", "symlink_loop", "proc_self", "fifo",
               "directory", "dot", "empty_location", "no_location", "missing_file",
               "nul_location", "nul_offset", "neg_offset", "odd_offsets", "hex_offset",
               "huge_offset", "length_abc", "length_2_33", "length_neg", "dup_location",
               "dup_offset", "unknown_key", "beyond", "length_mismatch", "short_file",
               "checksum_garbage", "dims_2_40"]
# attacks that must not read a byte (anything else may be refused or read inside the folder)
EXT_CONTROLS = {"control", "control_no_keys"}


def _carrier_tensor(entries, n=N_EXT, name="w", dtype=TensorProto.FLOAT, attack=""):
    t = ext_tensor(name, entries, n=n, dtype=dtype)
    if attack == "dims_2_40":
        t.dims[:] = [2**40]
    return t


def _c_initializer(ent, attack):
    t = _carrier_tensor(ent, attack=attack)
    return mk([helper.make_node("Identity", ["w"], ["y"])], [], [vi("y", [N_EXT])], [t])


def _c_initializer_used_by_add(ent, attack):
    t = _carrier_tensor(ent, attack=attack)
    return mk([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [N_EXT])],
              [vi("y", [N_EXT])], [t])


def _sparse(values, indices_ext=None):
    idx = arr(np.arange(N_EXT, dtype=np.int64), "idx") if indices_ext is None else indices_ext
    return helper.make_sparse_tensor(values, idx, [N_EXT])


def _c_sparse_initializer(ent, attack):
    sp = _sparse(_carrier_tensor(ent, attack=attack))
    return mk([helper.make_node("Identity", ["w"], ["y"])], [], [vi("y", [N_EXT])],
              sparse=[sp])


def _c_sparse_initializer_indices(ent, attack):
    vals = arr(np.ones(N_EXT, np.float32), "w")
    # int64 indices: 8 bytes each; the entries were made for 28 bytes, fix the length
    ent = [(k, str(8 * N_EXT) if k == "length" and v in (str(4 * N_EXT), str(4 * N_EXT + 4))
            and attack != "length_mismatch" else v) for k, v in ent]
    idx = _carrier_tensor(ent, name="idx", dtype=TensorProto.INT64, attack=attack)
    sp = helper.make_sparse_tensor(vals, idx, [N_EXT])
    return mk([helper.make_node("Identity", ["w"], ["y"])], [], [vi("y", [N_EXT])],
              sparse=[sp])


def _c_constant_value(ent, attack):
    t = _carrier_tensor(ent, attack=attack)
    return mk([helper.make_node("Constant", [], ["y"], value=t)], [], [vi("y", [N_EXT])])


def _c_constant_sparse_value(ent, attack):
    sp = _sparse(_carrier_tensor(ent, attack=attack))
    return mk([helper.make_node("Constant", [], ["y"], sparse_value=sp)], [], [vi("y", [N_EXT])])


def _c_constant_of_shape(ent, attack):
    ent = [(k, "4" if k == "length" and v == str(4 * N_EXT) else v) for k, v in ent]
    one = _carrier_tensor(ent, n=1, name="v", attack=attack)
    return mk([helper.make_node("ConstantOfShape", ["s"], ["y"], value=one)], [],
              [vi("y", [3])], [arr(np.array([3], np.int64), "s")])


def _c_unknown_tensors_attr(ent, attack):
    # a TENSORS and a SPARSE_TENSOR attribute on a node that has no such attributes
    n = helper.make_node("Identity", ["x"], ["y"])
    a = AttributeProto(name="extra", type=AttributeProto.TENSORS)
    a.tensors.append(_carrier_tensor(ent, attack=attack))
    n.attribute.append(a)
    return mk([n], [vi("x", [N_EXT])], [vi("y", [N_EXT])])


def _c_unknown_sparse_attr(ent, attack):
    # a SPARSE_TENSOR attribute on a node that has no such attribute
    n = helper.make_node("Identity", ["x"], ["y"])
    a = AttributeProto(name="extra", type=AttributeProto.SPARSE_TENSOR)
    a.sparse_tensor.CopyFrom(_sparse(_carrier_tensor(ent, attack=attack)))
    n.attribute.append(a)
    return mk([n], [vi("x", [N_EXT])], [vi("y", [N_EXT])])


def _c_label_encoder(ent, attack):
    # ai.onnx.ml LabelEncoder: keys_tensor inline, values_tensor external (a real op's TENSOR
    # attribute); the inputs 0..6 map to the values
    n = helper.make_node("LabelEncoder", ["k"], ["y"], domain="ai.onnx.ml",
                         keys_tensor=arr(np.arange(N_EXT, dtype=np.int64), "keys"),
                         values_tensor=_carrier_tensor(ent, name="values", attack=attack),
                         default_tensor=arr(np.array([-1.0], np.float32), "default"))
    m = mk([n], [vi("k", [N_EXT], TensorProto.INT64)], [vi("y", [N_EXT])])
    m.opset_import.add(domain="ai.onnx.ml", version=4)
    return m


def _c_if_body(ent, attack):
    then = helper.make_graph([helper.make_node("Constant", [], ["a"],
                                               value=_carrier_tensor(ent, attack=attack))],
                             "then", [], [vi("a", [N_EXT])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["b"])], "else", [],
                              [vi("b", [N_EXT])])
    return mk([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [vi("x", [N_EXT])], [vi("y", [N_EXT])], [arr(np.array(True), "c")])


def _loop_body_with(t):
    return helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", [t.name], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                 vi("v_in", [N_EXT])], [vi("cond_out", [], TensorProto.BOOL),
                                        vi("v_out", [N_EXT])], [t])


def _c_loop_body(ent, attack):
    body = _loop_body_with(_carrier_tensor(ent, attack=attack))
    return mk([helper.make_node("Loop", ["m", "", "x"], ["y"], body=body)],
              [vi("x", [N_EXT])], [vi("y", [N_EXT])], [arr(np.array(1, np.int64), "m")])


def _c_scan_body(ent, attack):
    t = _carrier_tensor(ent, name="w", attack=attack)
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "w"], ["s_out"]),
         helper.make_node("Identity", ["xi"], ["yi"])],
        "body", [vi("s_in", [N_EXT]), vi("xi", [2])], [vi("s_out", [N_EXT]), vi("yi", [2])],
        [t])
    return mk([helper.make_node("Scan", ["s0", "xs"], ["y", "ys"], body=body,
                                num_scan_inputs=1)],
              [vi("s0", [N_EXT]), vi("xs", [1, 2])], [vi("y", [N_EXT]), vi("ys", [1, 2])])


def _c_nested_if_loop(ent, attack):
    body = _loop_body_with(_carrier_tensor(ent, attack=attack))
    then = helper.make_graph([helper.make_node("Loop", ["m", "", "x"], ["l"], body=body)],
                             "then", [], [vi("l", [N_EXT])])
    return mk([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)],
              [vi("x", [N_EXT])], [vi("y", [N_EXT])],
              [arr(np.array(True), "c"), arr(np.array(1, np.int64), "m")])


def _c_nested_sparse_in_loop(ent, attack):
    sp = _sparse(_carrier_tensor(ent, attack=attack))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["v_out"], sparse_value=sp)],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                 vi("v_in", [N_EXT])], [vi("cond_out", [], TensorProto.BOOL),
                                        vi("v_out", [N_EXT])])
    return mk([helper.make_node("Loop", ["m", "", "x"], ["y"], body=body)],
              [vi("x", [N_EXT])], [vi("y", [N_EXT])], [arr(np.array(1, np.int64), "m")])


def _c_training_info(ent, attack):
    m = mk([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [N_EXT])],
           [vi("y", [N_EXT])])
    ti = m.training_info.add()
    ti.initialization.CopyFrom(helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w2"])], "init", [], [vi("w2", [N_EXT])],
        [_carrier_tensor(ent, attack=attack)]))
    return m


def _c_function(ent, attack):
    f = helper.make_function(
        "local", "Secret", ["a"], ["b"],
        [helper.make_node("Constant", [], ["c"], value=_carrier_tensor(ent, attack=attack)),
         helper.make_node("Add", ["a", "c"], ["b"])],
        [helper.make_opsetid("", OPSET)])
    m = mk([helper.make_node("Secret", ["x"], ["y"], domain="local")], [vi("x", [N_EXT])],
           [vi("y", [N_EXT])])
    m.opset_import.add(domain="local", version=1)
    m.functions.append(f)
    return m


CARRIERS = {
    "initializer": _c_initializer,
    "initializer_add": _c_initializer_used_by_add,
    "sparse_initializer": _c_sparse_initializer,
    "sparse_initializer_indices": _c_sparse_initializer_indices,
    "constant_value": _c_constant_value,
    "constant_sparse_value": _c_constant_sparse_value,
    "constant_of_shape_value": _c_constant_of_shape,
    "other_node_tensors_attr": _c_unknown_tensors_attr,
    "other_node_sparse_attr": _c_unknown_sparse_attr,
    "label_encoder_values": _c_label_encoder,
    "if_body": _c_if_body,
    "loop_body": _c_loop_body,
    "scan_body": _c_scan_body,
    "nested_if_loop": _c_nested_if_loop,
    "nested_sparse_in_loop": _c_nested_sparse_in_loop,
    "training_info": _c_training_info,
    "function": _c_function,
}

EXTDATA_COMBOS = [(c, a) for a in EXT_ATTACKS for c in CARRIERS]
# other ways in: bytes or a ModelProto without base_dir (every external reference refused),
# bytes with base_dir (the same confinement as a path), a path with the checker off, a path
# through a symlinked folder (valid data must still load)
EXT_FEED_ATTACKS = ["control", "cwd_name", "parent", "abs_cwd", "symlink_parent", "fifo",
                    "nul_location", "length_2_33"]
EXTDATA_FEED_COMBOS = [(c, a, f) for f in ("bytes", "proto", "bytes_base_dir", "path_nocheck",
                                           "path_via_link")
                       for a in EXT_FEED_ATTACKS for c in CARRIERS]


def _ext_case(gen, seed, carrier, attack, feed) -> Case:
    ent, files, what = _attack(attack, 4 * N_EXT)
    m = CARRIERS[carrier](ent, attack)
    inputs = []
    for v in m.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == TensorProto.INT64:
            inputs.append((v.name, np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)))
        else:
            inputs.append((v.name, np.zeros(shape, np.float32)))
    return Case(gen, seed, m.SerializeToString(), files=files, feed=feed, inputs=inputs,
                substitute=True, note=f"{carrier} / {attack}: {what} ({feed})")


def gen_extdata(seed: int) -> Case:
    carrier, attack = EXTDATA_COMBOS[seed % len(EXTDATA_COMBOS)]
    return _ext_case("extdata", seed, carrier, attack, "path")


def gen_extdata_feed(seed: int) -> Case:
    carrier, attack, feed = EXTDATA_FEED_COMBOS[seed % len(EXTDATA_FEED_COMBOS)]
    return _ext_case("extdata_feed", seed, carrier, attack, feed)


# --------------------------------------------------------------------------- resources
def _huge(rng):
    return rng.choice([2**31, 2**33, 2**40, 2**44, 2**62, 10**12])


def _r_constant_of_shape(rng):
    shape = [_huge(rng)] if rng.random() < 0.5 else [2**20, 2**20, rng.choice([1, 2**10])]
    if rng.random() < 0.2:
        shape = [-1, 5]
    return mk([helper.make_node("ConstantOfShape", ["s"], ["y"])], [],
              [vi("y", None, rank=len(shape))],
              [arr(np.array(shape, np.int64), "s")]), f"ConstantOfShape {shape}"


def _r_expand(rng):
    shape = rng.choice([[2**22, 2**22], [_huge(rng)], [2**15, 2**15, 2**14], [1, -5]])
    return mk([helper.make_node("Expand", ["x", "s"], ["y"])], [vi("x", [1])],
              [vi("y", None, rank=len(shape))],
              [arr(np.array(shape, np.int64), "s")]), f"Expand to {shape}"


def _r_tile(rng):
    reps = rng.choice([[_huge(rng)], [2**31], [-1]])
    return mk([helper.make_node("Tile", ["x", "r"], ["y"])], [vi("x", [2])], [vi("y", None)],
              [arr(np.array(reps, np.int64), "r")]), f"Tile repeats {reps}"


def _r_range(rng):
    start, limit, delta = rng.choice([(0, 10**12, 1), (0, 2**62, 1), (0.0, 1.0, 1e-12),
                                      (0, 10, 0), (0.0, float("inf"), 1.0),
                                      (0.0, 1.0, float("nan")), (0, -2**62, -1)])
    is_f = any(isinstance(v, float) for v in (start, limit, delta))
    dt = np.float32 if is_f else np.int64
    inits = [arr(np.array(start, dt), "a"), arr(np.array(limit, dt), "b"),
             arr(np.array(delta, dt), "d")]
    out = vi("y", None, TensorProto.FLOAT if is_f else TensorProto.INT64)
    return (mk([helper.make_node("Range", ["a", "b", "d"], ["y"])], [], [out], inits),
            f"Range({start}, {limit}, {delta})")


def _r_pad(rng):
    p = _huge(rng)
    pads = rng.choice([[0, p], [p, p], [-p, 0], [2**31 - 1, 2**31 - 1]])
    return mk([helper.make_node("Pad", ["x", "p"], ["y"])], [vi("x", [2])], [vi("y", None)],
              [arr(np.array(pads, np.int64), "p")]), f"Pad {pads}"


def _r_resize(rng):
    if rng.random() < 0.5:
        sizes = [1, 1, _huge(rng), rng.choice([1, 2**20])]
        return (mk([helper.make_node("Resize", ["x", "", "", "sz"], ["y"])],
                   [vi("x", [1, 1, 2, 2])], [vi("y", None, rank=4)],
                   [arr(np.array(sizes, np.int64), "sz")]), f"Resize sizes {sizes}")
    sc = rng.choice([1e9, 1e30, float("inf"), float("nan"), -1.0, 0.0])
    return (mk([helper.make_node("Resize", ["x", "", "sc"], ["y"])], [vi("x", [1, 1, 2, 2])],
               [vi("y", None, rank=4)], [arr(np.array([1, 1, sc, sc], np.float32), "sc")]),
            f"Resize scales {sc}")


def _r_onehot(rng):
    depth = rng.choice([2**40, 2**31, 10**12, -1, 0])
    return (mk([helper.make_node("OneHot", ["i", "d", "v"], ["y"])], [vi("i", [3],
                                                                          TensorProto.INT64)],
               [vi("y", None, rank=2)], [arr(np.array(depth, np.int64), "d"),
                                 arr(np.array([0, 1], np.float32), "v")]), f"OneHot depth {depth}")


def _r_split(rng):
    k = rng.random()
    if k < 0.5:
        n = rng.choice([2**31, 2**31 - 1, 2**62, 0, -1, 10**6])
        m = mk([helper.make_node("Split", ["x"], ["y", "z"], num_outputs=n)], [vi("x", [4])],
               [vi("y", None), vi("z", None)], opset=18)
        return m, f"Split num_outputs={n}"
    sp = rng.choice([[2**62, -2**62 + 4], [2**31] * 2, [0] * 100000, [-1, 5]])
    m = mk([helper.make_node("Split", ["x", "s"], ["y", "z"])], [vi("x", [4])],
           [vi("y", None), vi("z", None)], [arr(np.array(sp, np.int64), "s")], opset=18)
    return m, f"Split split=[{sp[0]}, ...]x{len(sp)}"


def _r_slice(rng):
    st, en, stp = rng.choice([([0], [2**62], [1]), ([-2**63], [2**63 - 1], [1]),
                              ([0], [4], [0]), ([2**62], [-2**62], [-1]),
                              ([0], [4], [-2**63]), ([0], [4], [2**62])])
    m = mk([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], [vi("x", [4])],
           [vi("y", None)], [arr(np.array(st, np.int64), "s"), arr(np.array(en, np.int64), "e"),
                             arr(np.array([0], np.int64), "a"),
                             arr(np.array(stp, np.int64), "t")])
    return m, f"Slice {st}:{en}:{stp}"


def _r_loop(rng):
    trip = rng.choice([2**62, 2**63 - 1, 10**9, -1])
    cond_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                 vi("v_in", [1])], [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [1])])
    if rng.random() < 0.5:  # no trip count, condition always true
        m = mk([helper.make_node("Loop", ["", "c", "x"], ["y"], body=cond_body)],
               [vi("x", [1])], [vi("y", [1])], [arr(np.array(True), "c")])
        return m, "Loop without trip count, condition always true"
    m = mk([helper.make_node("Loop", ["m", "", "x"], ["y"], body=cond_body)], [vi("x", [1])],
           [vi("y", [1])], [arr(np.array(trip, np.int64), "m")])
    return m, f"Loop trip count {trip}"


def _r_loop_scan_outputs(rng):
    # each iteration emits a scan output: memory grows with the trip count
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v_in"], ["v_out"]),
         helper.make_node("ConstantOfShape", ["s"], ["big"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL),
                 vi("v_in", [1])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [1]), vi("big", None)],
        [arr(np.array([rng.choice([2**16, 2**20])], np.int64), "s")])
    m = mk([helper.make_node("Loop", ["m", "", "x"], ["y", "all"], body=body)], [vi("x", [1])],
           [vi("y", [1]), vi("all", None, rank=2)], [arr(np.array(2**40, np.int64), "m")])
    return m, "Loop 2**40 iterations, each emitting a 1M scan output"


def _r_scan_axes(rng):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
         helper.make_node("Identity", ["xi"], ["yi"])],
        "body", [vi("s_in", [2]), vi("xi", [2])], [vi("s_out", [2]), vi("yi", [2])])
    attr = rng.choice([{"scan_input_axes": [2**31]}, {"scan_output_axes": [-2**31]},
                       {"num_scan_inputs": 2**31}, {"num_scan_inputs": 0},
                       {"scan_input_directions": [2**62]}])
    m = mk([helper.make_node("Scan", ["s0", "xs"], ["y", "ys"], body=body,
                             **({"num_scan_inputs": 1} | attr))],
           [vi("s0", [2]), vi("xs", [3, 2])], [vi("y", [2]), vi("ys", None, rank=2)])
    return m, f"Scan {attr}"


_AXIS_OPS = [
    ("LayerNormalization", 3, "axis"), ("Softmax", 1, "axis"), ("LogSoftmax", 1, "axis"),
    ("Hardmax", 1, "axis"), ("Concat", 1, "axis"), ("Flatten", 1, "axis"),
    ("ArgMax", 1, "axis"), ("Gather", 2, "axis"), ("CumSum", 2, None),
    ("Squeeze", 2, None), ("Unsqueeze", 2, None), ("Transpose", 1, "perm"),
    ("ReduceSum", 2, None), ("ReduceMax", 1, "axes"), ("TopK", 2, "axis"),
    ("DepthToSpace", 1, "blocksize"), ("SpaceToDepth", 1, "blocksize"),
    ("Compress", 2, "axis"), ("GatherElements", 2, "axis"), ("ScatterElements", 3, "axis"),
    ("ReverseSequence", 2, "batch_axis"), ("Trilu", 2, None), ("EyeLike", 1, "k"),
    ("MeanVarianceNormalization", 1, "axes"), ("LpNormalization", 1, "axis"),
    ("InstanceNormalization", 3, "epsilon"), ("GroupNormalization", 3, "num_groups"),
    ("Einsum", 1, "equation"), ("Shape", 1, "start"), ("Multinomial", 1, "sample_size"),
    ("RandomNormal", 0, "shape"), ("RandomUniform", 0, "shape"), ("Bernoulli", 1, "seed"),
    ("MaxPool", 1, "kernel_shape"), ("AveragePool", 1, "strides"), ("Conv", 2, "dilations"),
    ("ConvTranspose", 2, "output_padding"), ("LpPool", 1, "p"), ("Upsample", 2, "mode"),
    ("NonMaxSuppression", 5, "center_point_box"), ("CenterCropPad", 2, "axes"),
    ("Col2Im", 3, None), ("DFT", 1, "axis"), ("STFT", 2, "onesided"),
    ("MelWeightMatrix", 5, None), ("Mod", 2, "fmod"), ("BitShift", 2, "direction"),
    ("Cast", 1, "to"), ("CastLike", 2, "saturate"), ("QuantizeLinear", 2, "axis"),
    ("DequantizeLinear", 2, "axis"), ("RoiAlign", 3, "output_height"),
    ("GridSample", 2, "mode"), ("LRN", 1, "size"), ("Gemm", 2, "transA"),
    ("GRU", 3, "hidden_size"), ("LSTM", 3, "hidden_size"), ("RNN", 3, "hidden_size"),
]


def _int_inputs_for(op):
    return op in ("Gather", "Squeeze", "Unsqueeze", "ReduceSum", "TopK", "Compress",
                  "GatherElements", "ScatterElements", "ReverseSequence", "Trilu", "CumSum",
                  "NonMaxSuppression", "CenterCropPad", "Col2Im", "MelWeightMatrix", "STFT",
                  "Mod", "BitShift")


def _r_attr_extreme(rng):
    op, n_in, attr = rng.choice(_AXIS_OPS)
    x = vi("x", [1, 2, 3, 4])
    inputs = [x]
    inits = []
    names = ["x"]
    for i in range(1, n_in):
        nm = f"i{i}"
        names.append(nm)
        if _int_inputs_for(op) or op in ("Reshape",):
            inits.append(arr(np.array([rng.choice([0, 1, -1, 2**31, 2**62])], np.int64), nm))
        else:
            inits.append(arr(np.ones([rng.choice([1, 2, 3])], np.float32), nm))
    if n_in == 0:
        names = []
        inputs = []
    if attr is not None:
        schema = _schema_attrs(helper.make_node(op, [], []), 18)
        typ = schema.get(attr, AttributeProto.INT)
        a = make_attr(rng, attr, typ)
        if typ == AttributeProto.INT and rng.random() < 0.6:
            a.i = rng.choice([2**31, -2**31, 2**62, 2**31 - 1])
        node = helper.make_node(op, names, ["y"])
        node.attribute.append(a)
        val = helper.get_attribute_value(a)
        desc = f"{op}.{attr}={str(val)[:40]}"
    else:
        node = helper.make_node(op, names, ["y"])
        desc = f"{op} with extreme int inputs"
    m = mk([node], inputs, [vi("y", None, rank=4)], inits, opset=18)
    return m, desc


def _r_reshape(rng):
    shape = rng.choice([[2**31, 2**31], [-1, -1], [0, 2**62], [-2**62], [2**62, 0]])
    m = mk([helper.make_node("Reshape", ["x", "s"], ["y"])], [vi("x", [4])],
           [vi("y", None, rank=len(shape))], [arr(np.array(shape, np.int64), "s")])
    return m, f"Reshape to {shape}"


def _r_matmul_declared(rng):
    d = _huge(rng)
    return (mk([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [2, d])],
               [vi("y", None, rank=2)], [arr(np.ones((4, 4), np.float32), "w")]),
            f"MatMul with declared dim {d}")


def _r_random_normal(rng):
    shape = [_huge(rng)]
    return (mk([helper.make_node(rng.choice(["RandomNormal", "RandomUniform"]), [], ["y"],
                                 shape=shape)], [], [vi("y", None)]), f"Random* shape {shape}")


_T = TensorProto
_BINARY_OPS = [("Add", _T.FLOAT), ("Sub", _T.FLOAT), ("Mul", _T.FLOAT), ("Div", _T.FLOAT),
               ("Pow", _T.FLOAT), ("Max", _T.FLOAT), ("Min", _T.FLOAT), ("Mean", _T.FLOAT),
               ("Sum", _T.FLOAT), ("Equal", _T.FLOAT), ("Less", _T.FLOAT),
               ("Greater", _T.FLOAT), ("LessOrEqual", _T.FLOAT), ("GreaterOrEqual", _T.FLOAT),
               ("And", _T.BOOL), ("Or", _T.BOOL), ("Xor", _T.BOOL), ("BitwiseAnd", _T.INT32),
               ("BitwiseOr", _T.INT32), ("BitwiseXor", _T.INT32), ("BitShift", _T.UINT32),
               ("Mod", _T.INT32), ("PRelu", _T.FLOAT)]
_COMPARISONS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"}


def _r_broadcast_bomb(rng):
    """Small inputs whose result is huge: broadcasting, outer products, padding, strides."""
    k = rng.choice([2**15, 2**16, 2**17])
    kind = rng.choice(["binary", "binary", "binary", "Where", "MatMul", "Einsum", "Conv_pads",
                       "ConvTranspose_strides", "MaxPool_pads", "Concat_many", "Expand_runtime",
                       "Tile_runtime", "CumSum_big"])
    x = np.ones((k, 1), np.float32)
    y = np.ones((1, k), np.float32)
    if kind == "binary":   # every broadcasting binary operator
        op, dt = rng.choice(_BINARY_OPS)
        npdt = helper.tensor_dtype_to_np_dtype(dt)
        out_dt = TensorProto.BOOL if op in _COMPARISONS else dt
        kw = {"direction": "LEFT"} if op == "BitShift" else {}
        m = mk([helper.make_node(op, ["x", "y"], ["z"], **kw)],
               [vi("x", ["a", 1], dt), vi("y", [1, "b"], dt)], [vi("z", None, out_dt, rank=2)],
               opset=18)
        return (m, [("x", x.astype(npdt)), ("y", y.astype(npdt))],
                f"{op} broadcast [{k},1] x [1,{k}]")
    if kind == "Where":
        m = mk([helper.make_node("Where", ["c", "x", "y"], ["z"])],
               [vi("c", [1, 1], TensorProto.BOOL), vi("x", ["a", 1]), vi("y", [1, "b"])],
               [vi("z", None, rank=2)])
        return m, [("c", np.ones((1, 1), bool)), ("x", x), ("y", y)], f"Where broadcast {k}"
    if kind == "MatMul":
        m = mk([helper.make_node("MatMul", ["x", "y"], ["z"])], [vi("x", ["a", 1]),
                                                                  vi("y", [1, "b"])],
               [vi("z", None, rank=2)])
        return m, [("x", x), ("y", y)], f"MatMul outer product {k}"
    if kind == "Einsum":
        m = mk([helper.make_node("Einsum", ["x", "y"], ["z"], equation="i,j->ij")],
               [vi("x", ["a"]), vi("y", ["b"])], [vi("z", None, rank=2)])
        return m, [("x", x.ravel()), ("y", y.ravel())], f"Einsum outer product {k}"
    if kind == "Conv_pads":
        p = rng.choice([2**15, 2**20])
        m = mk([helper.make_node("Conv", ["x", "w"], ["z"], pads=[p, p, p, p])],
               [vi("x", [1, 1, 2, 2])], [vi("z", None, rank=4)],
               [arr(np.ones((1, 1, 1, 1), np.float32), "w")])
        return m, [("x", np.ones((1, 1, 2, 2), np.float32))], f"Conv pads {p}"
    if kind == "ConvTranspose_strides":
        st = rng.choice([2**15, 2**20])
        m = mk([helper.make_node("ConvTranspose", ["x", "w"], ["z"], strides=[st, st])],
               [vi("x", [1, 1, 2, 2])], [vi("z", None, rank=4)],
               [arr(np.ones((1, 1, 1, 1), np.float32), "w")])
        return m, [("x", np.ones((1, 1, 2, 2), np.float32))], f"ConvTranspose strides {st}"
    if kind == "MaxPool_pads":
        p = rng.choice([2**15, 2**20])
        m = mk([helper.make_node("MaxPool", ["x"], ["z"], kernel_shape=[1, 1],
                                 pads=[0, 0, p, p])],
               [vi("x", [1, 1, 2, 2])], [vi("z", None, rank=4)])
        return m, [("x", np.ones((1, 1, 2, 2), np.float32))], f"MaxPool pads {p}"
    if kind == "Concat_many":
        n = rng.choice([10000, 100000])
        m = mk([helper.make_node("Concat", ["x"] * n, ["z"], axis=0)], [vi("x", ["a", "b"])],
               [vi("z", None, rank=2)])
        return m, [("x", np.ones((64, 1024), np.float32))], f"Concat of {n} inputs"
    if kind in ("Expand_runtime", "Tile_runtime"):
        op = kind.split("_")[0]
        shape = rng.choice([[2**20, 2**20], [2**40], [2**31, 2]])
        m = mk([helper.make_node(op, ["x", "s"], ["z"])],
               [vi("x", [1]), vi("s", [len(shape)], TensorProto.INT64)],
               [vi("z", None, rank=len(shape))])
        xin = np.ones(1 if op == "Expand" else [1] * 1, np.float32)
        if op == "Tile":
            shape = shape[:1]
            m = mk([helper.make_node(op, ["x", "s"], ["z"])],
                   [vi("x", [1]), vi("s", [1], TensorProto.INT64)], [vi("z", None)])
        return m, [("x", xin), ("s", np.array(shape, np.int64))], f"{op} to {shape} (runtime)"
    m = mk([helper.make_node("CumSum", ["x", "ax"], ["z"])], [vi("x", ["a", 1])],
           [vi("z", None, rank=2)], [arr(np.array(0, np.int64), "ax")])
    return m, [("x", x)], "CumSum over a long axis (fine)"


def _runtime_shape_inputs(m: onnx.ModelProto):
    """Move a model's small int64 initializers to graph inputs fed at run time (the guards
    must hold when the sizes arrive with the inputs, not only from the file)."""
    g = m.graph
    moved = []
    keep = []
    for t in g.initializer:
        if t.data_type == TensorProto.INT64 and len(t.dims) <= 1:
            a = numpy_helper.to_array(t)
            g.input.append(vi(t.name, list(a.shape), TensorProto.INT64))
            moved.append((t.name, a))
        else:
            keep.append(t)
    del g.initializer[:]
    g.initializer.extend(keep)
    return moved


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _r_deep_nesting(rng):
    """If inside If inside If ... (recursive walkers, protobuf's recursion limit). Encoded by
    hand: the protobuf library refuses to build messages nested past its own limit."""
    depth = rng.choice([10, 30, 40, 100, 1000])
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "leaf", [],
                             [vi("o", [2])]).SerializeToString()
    out_vi = vi("o", [2]).SerializeToString()
    g = leaf
    for _ in range(depth):
        then_a = _ld(1, b"then_branch") + _ld(6, g) + _varint(20 << 3) + _varint(5)
        else_a = _ld(1, b"else_branch") + _ld(6, leaf) + _varint(20 << 3) + _varint(5)
        node = _ld(1, b"c") + _ld(2, b"o") + _ld(4, b"If") + _ld(5, then_a) + _ld(5, else_a)
        g = _ld(1, node) + _ld(2, b"level") + _ld(12, out_vi)
    shell = mk([], [vi("x", [2])], [vi("y", [2])], [arr(np.array(True), "c")])
    top_then = _ld(1, b"then_branch") + _ld(6, g) + _varint(20 << 3) + _varint(5)
    top_else = _ld(1, b"else_branch") + _ld(6, leaf) + _varint(20 << 3) + _varint(5)
    top = _ld(1, b"c") + _ld(2, b"y") + _ld(4, b"If") + _ld(5, top_then) + _ld(5, top_else)
    data = shell.SerializeToString() + _ld(7, _ld(1, top))   # merged into the graph field
    return data, f"If nested {depth + 1} deep"


def _r_strings(rng):
    """String ops with hostile patterns and sizes (catastrophic backtracking, huge splits)."""
    k = rng.random()
    x = np.array(["a" * rng.choice([28, 40, 5000]) + "!"], dtype=object)
    if k < 0.5:
        pat = rng.choice(["(a+)+$", "(a|aa)+$", "(a*)*b", "((a+)+)+c", "(", "[z-a]", "\\"])
        m = mk([helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pat)],
               [vi("x", [1], TensorProto.STRING)], [vi("y", [1], TensorProto.BOOL)], opset=20)
        return m, [("x", x)], f"RegexFullMatch pattern {pat!r} on {len(x[0])} chars"
    if k < 0.75:
        maxsplit = rng.choice([2**62, -1, 0, 2**31])
        m = mk([helper.make_node("StringSplit", ["x"], ["y", "n"], maxsplit=maxsplit,
                                 delimiter=rng.choice(["", "a", "aa"]))],
               [vi("x", [1], TensorProto.STRING)],
               [vi("y", None, TensorProto.STRING, rank=2), vi("n", [1], TensorProto.INT64)],
               opset=20)
        return m, [("x", x)], f"StringSplit maxsplit={maxsplit}"
    n = rng.choice([10, 10**5])
    m = mk([helper.make_node("StringNormalizer", ["x"], ["y"], stopwords=["a" * 3] * n,
                             case_change_action=rng.choice(["UPPER", "NONE", "bogus"]))],
           [vi("x", [1], TensorProto.STRING)], [vi("y", None, TensorProto.STRING)], opset=20)
    return m, [("x", x)], f"StringNormalizer with {n} stopwords"


def _r_long_chain(rng):
    """Many nodes: a long chain, or a wide fan-out into one Sum."""
    n = rng.choice([2000, 10000, 50000])
    if rng.random() < 0.5:
        nodes = [helper.make_node("Identity", [f"v{i}" if i else "x"], [f"v{i + 1}"])
                 for i in range(n)]
        nodes.append(helper.make_node("Identity", [f"v{n}"], ["y"]))
        return mk(nodes, [vi("x", [2])], [vi("y", [2])]), f"chain of {n} Identity nodes"
    nodes = [helper.make_node("Neg", ["x"], [f"v{i}"]) for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"v{i}" for i in range(n)], ["y"]))
    return mk(nodes, [vi("x", [2])], [vi("y", [2])]), f"Sum of {n} inputs"


RESOURCE_BUILDERS = [_r_constant_of_shape, _r_expand, _r_tile, _r_range, _r_pad, _r_resize,
                     _r_onehot, _r_split, _r_slice, _r_loop, _r_loop_scan_outputs, _r_scan_axes,
                     _r_attr_extreme, _r_attr_extreme, _r_attr_extreme, _r_reshape,
                     _r_matmul_declared, _r_random_normal, _r_deep_nesting, _r_long_chain]


def gen_resource(seed: int) -> Case:
    rng = random.Random(f"resource:{seed}")
    if rng.random() < 0.25:
        m, inputs, note = (_r_strings if rng.random() < 0.2 else _r_broadcast_bomb)(rng)
        return Case("resource", seed, m.SerializeToString(), inputs=inputs, note=note)
    build = rng.choice(RESOURCE_BUILDERS)
    m, note = build(rng)
    if isinstance(m, bytes):   # hand-encoded
        return Case("resource", seed, m, note=note)
    inputs = None
    if rng.random() < 0.35:
        moved = _runtime_shape_inputs(m)
        if moved:
            inputs = moved + [(k, v) for k, v in declared_small_inputs(m).items()
                              if k not in dict(moved)]
            note += " (sizes given as inputs at run time)"
    return Case("resource", seed, m.SerializeToString(), inputs=inputs, note=note)


def declared_small_inputs(m: onnx.ModelProto) -> dict:
    """Ones of the declared float inputs' shapes (symbolic dims: 2)."""
    out = {}
    for v in m.graph.input:
        tt = v.type.tensor_type
        if tt.elem_type == TensorProto.INT64:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
        try:
            dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except Exception:  # noqa: BLE001
            dt = np.float32
        out[v.name] = np.ones(shape, dt)
    return out


GENERATORS = {
    "mut_attr": gen_mut_attr,
    "mut_graph": gen_mut_graph,
    "mut_meta": gen_mut_meta,
    "mut_rawdata": gen_mut_rawdata,
    "mut_bytes": gen_mut_bytes,
    "mut_inputs": gen_mut_inputs,
    "mut_mix": gen_mut_mix,
    "extdata": gen_extdata,
    "extdata_feed": gen_extdata_feed,
    "resource": gen_resource,
}
# share of a sweep per generator
WEIGHTS = {"mut_attr": 20, "mut_graph": 15, "mut_meta": 6, "mut_rawdata": 8, "mut_bytes": 10,
           "mut_inputs": 10, "mut_mix": 10, "extdata": 7, "extdata_feed": 4, "resource": 10}


def make_case(generator: str, seed: int) -> Case:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return GENERATORS[generator](seed)


def sweep(n: int, seed: int = 0, only=None) -> list[tuple[str, int]]:
    """(generator, seed) for ``n`` cases of a sweep: generators (all, or ``only``) drawn by
    WEIGHTS, each generator's seeds counting up from ``seed * 1_000_000``."""
    rng = random.Random(seed)
    names = sorted(only or WEIGHTS)
    weights = [WEIGHTS[k] for k in names]
    counters = dict.fromkeys(names, 0)
    out = []
    for _ in range(n):
        g = rng.choices(names, weights)[0]
        out.append((g, seed * 1_000_000 + counters[g]))
        counters[g] += 1
    return out


def ci_sample() -> list[tuple[str, int]]:
    """The fixed CI sample: every external-data combination, plus fixed seeds of the others."""
    out = [("extdata", i) for i in range(len(EXTDATA_COMBOS))]
    out += [("extdata_feed", i) for i in range(len(EXTDATA_FEED_COMBOS))]
    per = {"mut_attr": 350, "mut_graph": 250, "mut_meta": 100, "mut_rawdata": 150,
           "mut_bytes": 150, "mut_inputs": 150, "mut_mix": 150, "resource": 200}
    for g, k in per.items():
        out += [(g, i) for i in range(k)]
    return out

