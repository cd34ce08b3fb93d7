"""Shapes at the user's input shapes: bind symbolic dims, infer, and run where inference stops.

1. :func:`bind` turns the model's declared inputs plus the user's ``shapes`` (whole shapes by
   input name) and ``dims`` (symbolic dim name -> size) into one concrete shape per input; a
   dim left unbound is an error naming it, unless ``default_dim`` is given.
2. The model is loaded again with those input shapes (``workbench.graph.load.load``): onnx's
   shape inference (with data propagation, in a helper process) fills in what it can.
3. :func:`complete_by_running`: values whose shape is still unknown (data-dependent shapes,
   ops onnx cannot infer through, contrib ops) are made graph outputs of a copy of the model,
   which our own engine runs once on random inputs at the bound shapes. Shapes found that way
   are marked ``"run"`` (they hold for those inputs; a NonZero's count, for instance, depends
   on the data).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from workbench.arrays.dtypes import np_dtype_of_onnx
from workbench.errors import InputError, WorkbenchError

#: bits per element of the packed ONNX types (everything else: the numpy itemsize)
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def elem_bits(elem_type: int | None) -> int | None:
    """Bits per element of ONNX element type ``elem_type`` (None when unknown / strings)."""
    if not elem_type or elem_type == TensorProto.STRING:
        return None
    try:
        name = TensorProto.DataType.Name(int(elem_type))
    except ValueError:
        return None
    if name in _PACKED_BITS:
        return _PACKED_BITS[name]
    try:
        return int(np_dtype_of_onnx(elem_type).itemsize) * 8
    except Exception:
        return None


def is_known(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape)


def parse_shape(text: str) -> tuple:
    """``"1,3,224,224"`` or ``"1x3x224x224"`` -> (1, 3, 224, 224)."""
    parts = [p for p in text.replace("x", ",").replace(" ", "").split(",") if p != ""]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise InputError(f"shape {text!r}: expected integers separated by commas "
                         f"(e.g. 1,3,224,224)") from None
    if any(d < 0 for d in dims):
        raise InputError(f"shape {text!r}: dims must be >= 0")
    return dims


def bind(inputs, shapes: dict | None = None, dims: dict | None = None,
         default_dim: int | None = None) -> dict:
    """{input name: concrete shape} from the declared inputs (``ValueInfo``s), whole ``shapes``
    by name and symbolic ``dims`` by name. Raises ``InputError`` naming what is unbound."""
    shapes = dict(shapes or {})
    dims = dict(dims or {})
    names = [v.name for v in inputs]
    unknown = [k for k in shapes if k not in names]
    if unknown:
        raise InputError(f"shapes given for {unknown}, but the model's inputs are {names}")
    out, missing = {}, []
    for v in inputs:
        if v.type_proto is not None and not v.is_tensor:
            raise InputError(f"input {v.name!r} is not a tensor ({v.type_proto}); the analysis "
                             f"needs tensor inputs")
        if v.name in shapes:
            s = tuple(int(d) for d in shapes[v.name])
            if v.shape is not None and len(v.shape) != len(s):
                raise InputError(f"input {v.name!r}: shape {list(s)} has rank {len(s)}, the "
                                 f"model declares {_fmt(v.shape)} (rank {len(v.shape)})")
            if v.shape is not None:
                for i, (want, got) in enumerate(zip(v.shape, s)):
                    if isinstance(want, int) and want > 0 and want != got:
                        raise InputError(f"input {v.name!r}: dim {i} is {want} in the model, "
                                         f"{got} in the shape given ({list(s)})")
            out[v.name] = s
            continue
        if v.shape is None:
            missing.append(f"{v.name!r} (rank unknown: give its whole shape)")
            continue
        s = []
        for i, d in enumerate(v.shape):
            if isinstance(d, int) and d > 0:
                s.append(d)
            elif isinstance(d, str) and d in dims:
                s.append(int(dims[d]))
            elif default_dim is not None:
                s.append(int(default_dim))
            else:
                missing.append(f"{v.name!r} dim {i}" + (f" ({d!r})" if isinstance(d, str)
                                                         else ""))
                s = None
                break
        if s is not None:
            out[v.name] = tuple(s)
    if missing:
        raise InputError(
            "the analysis needs concrete input shapes; unbound: " + ", ".join(missing)
            + ". Bind them with shapes={'input': (1, 3, 224, 224)} or dims={'batch': 1} "
              "(command line: --shape input=1,3,224,224 or --dim batch=1), or pass "
              "default_dim=1")
    return out


def _fmt(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def random_feeds(inputs, bound: dict, seed: int = 0) -> dict:
    """Random feeds at the bound shapes: standard normal floats, zeros for integers (valid
    indices and token ids), False for bools."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in inputs:
        shape = bound[v.name]
        dt = np_dtype_of_onnx(v.dtype or TensorProto.FLOAT)
        if dt.kind == "f":
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iub":
            feeds[v.name] = np.zeros(shape, dt)
        else:
            raise InputError(f"input {v.name!r}: cannot make a value of type {dt} to run the "
                             f"model for its shapes")
    return feeds


def complete_by_running(proto: onnx.ModelProto, graph, names: list, bound: dict,
                        values: tuple = ()) -> tuple:
    """Run our engine on a copy of ``proto`` whose outputs are ``names`` (values of
    ``graph`` whose shapes inference left unknown) and ``values`` (small values a cost rule
    reads, e.g. a head shape computed from Shape ops). Returns ``({name: (shape,
    elem_type)}, {name: array}, note)``; on failure ``({}, {}, note)`` saying why."""
    import workbench.backend as backend  # noqa: PLC0415  (the engine, only when needed)
    from workbench.arrays.dtypes import onnx_dtype_of_np  # noqa: PLC0415

    m = onnx.ModelProto()
    m.CopyFrom(proto)
    have = {o.name for o in m.graph.output}
    names = list(dict.fromkeys(list(names) + list(values)))
    for name in names:
        if name not in have:
            m.graph.output.append(helper.make_empty_tensor_value_info(name))
    try:
        rep = backend.prepare(m, optimize=False, check=False)
        outs = rep.run(random_feeds(graph.inputs, bound))
    except WorkbenchError as e:
        return {}, {}, (f"{len(names)} value shape(s) left unknown by shape inference could "
                        f"not be found by running the model: {str(e).splitlines()[0][:300]}")
    except Exception as e:  # noqa: BLE001  (a failed helper run must not stop the analysis)
        return {}, {}, (f"{len(names)} value shape(s) left unknown by shape inference could not be "
                    f"found by running the model: {type(e).__name__}: {str(e)[:300]}")
    found, got = {}, {}
    for name, o in zip(rep.output_names, outs):
        if name in values and isinstance(o, np.ndarray) and o.size <= 64:
            got[name] = np.array(o)
        if name in names and isinstance(o, np.ndarray):
            try:
                t = onnx_dtype_of_np(o.dtype)
            except (TypeError, KeyError, ValueError):
                t = None
            found[name] = (tuple(int(d) for d in o.shape), t)
    return found, got, (f"{len(found)} value shape(s) came from running our engine once on random "
                   f"inputs at the bound shapes (shape inference left them unknown)")
