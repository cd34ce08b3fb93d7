"""The one wrapper that names the node in an error raised while running a kernel.

:func:`node_error` turns whatever a kernel raised into the error the user sees:

- a :class:`~workbench.errors.WorkbenchError` (a kernel's own ``InputError``, ``ShapeError``,
  ...) keeps its type and gets the node prefixed once: ``node 'conv1' (Conv): ...``;
- a device out-of-memory failure becomes a ``DeviceError`` naming the device, the node and
  the bytes requested (:func:`workbench.runtime.placement.oom_error`);
- a ``MemoryError`` becomes a ``ResourceError`` naming the node and its inputs;
- anything else (a numpy error deep inside a kernel) becomes a ``KernelError`` naming the
  node, op, opset and the inputs' dtypes and shapes.

The run loop (:mod:`workbench.runtime.run`) calls it; so may any other place that runs a
kernel for a node (the tape's ``run_op``).
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.arrays import is_array
from workbench.errors import KernelError, ResourceError, WorkbenchError
from workbench.runtime import placement


def locate(e: WorkbenchError, node_name: str | None, op_type: str) -> WorkbenchError:
    """``e`` with ``node 'name' (Op): `` prefixed to its message, once (an error that already
    names its node, or went through here before, is left alone)."""
    if node_name is None or getattr(e, "_located", False) or str(e).startswith("node "):
        return e
    e.args = (f"node {node_name!r} ({op_type}): {e}",) + e.args[1:]
    e._located = True
    return e


def describe_inputs(args: Sequence, names: Sequence[str] = ()) -> str:
    """``name: dtype[shape], ...`` of a kernel's arguments (``(none)`` when it has none)."""
    parts = []
    for k, a in enumerate(args):
        name = names[k] if k < len(names) else f"input {k}"
        if a is None:
            parts.append(f"{name or '<omitted>'}=None")
        elif is_array(a):
            parts.append(f"{name}: {a.dtype}{list(a.shape)}")
        else:
            parts.append(f"{name}: {type(a).__name__}")
    return ", ".join(parts) or "(none)"


def node_error(e: BaseException, *, node_name: str | None, op_type: str,
               opset: int | None = None, args: Sequence = (), input_names: Sequence[str] = (),
               device=None) -> BaseException:
    """The error to raise for ``e``, raised by the kernel of node ``node_name`` (an
    ``op_type`` node of ``opset``) called on ``args`` (named ``input_names``), on ``device``
    (None: the host). Returns ``e`` itself for a workbench error (located); raise the result
    ``from e`` otherwise."""
    if isinstance(e, WorkbenchError):
        return locate(e, node_name, op_type)
    if placement.is_oom(e):
        return placement.oom_error(e, device, node_name, op_type)
    if node_name is not None:
        who, which = f"node {node_name!r} ({op_type})", f"node {node_name!r} ({op_type}, opset "
    else:
        who, which = op_type, f"{op_type} (opset "
    inputs = describe_inputs(args, input_names)
    if isinstance(e, MemoryError):
        return ResourceError(f"{who}: out of memory ({e}); inputs: {inputs}. The model asks for "
                             f"more memory than this machine has")
    return KernelError(f"{which}{opset or '?'}) failed: {type(e).__name__}: {e}; inputs: "
                       f"{inputs}", node_name=node_name, op_type=op_type)
