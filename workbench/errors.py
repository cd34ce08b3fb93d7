"""Errors raised by ONNX Workbench.

Every message is written for a person: what went wrong, where (file, node, op, opset, input
name, shapes), and what is supported or how to fix it.
"""

from __future__ import annotations

# a message longer than this is cut in the middle (a hostile model's 100,000-element attribute
# must not become a megabyte of error text)
MAX_MESSAGE_CHARS = 2000


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut in the middle to about ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = text[:limit * 3 // 4], text[-(limit // 4):]
    return f"{head} ...[{len(text) - len(head) - len(tail):,} characters cut]... {tail}"


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""

    def __init__(self, *args):
        if args and isinstance(args[0], str):
            args = (shorten(args[0]),) + args[1:]
        super().__init__(*args)

    def __str__(self) -> str:   # also when args were replaced later (a node-name prefix)
        return shorten(super().__str__(), MAX_MESSAGE_CHARS + 500)


class ModelLoadError(WorkbenchError):
    """The model file or proto cannot be read, validated or prepared."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        prefix = f"{path}: " if path else ""
        super().__init__(prefix + message)


class UnsupportedOperatorError(WorkbenchError):
    """No kernel exists for an operator at the model's opset."""

    def __init__(self, op_type: str, domain: str = "", opset: int | None = None,
                 node_name: str | None = None, supported_versions=(), reason: str | None = None):
        self.op_type = op_type
        self.domain = domain or "ai.onnx"
        self.opset = opset
        self.node_name = node_name
        self.supported_versions = tuple(supported_versions)
        where = f" (node {node_name!r})" if node_name else ""
        what = f"operator {self.domain}::{op_type}"
        if opset is not None:
            what += f" at opset {opset}"
        if reason:
            msg = f"{what}{where} is not supported: {reason}"
        elif self.supported_versions:
            vers = ", ".join(str(v) for v in self.supported_versions)
            msg = (f"{what}{where} is not supported; kernels exist for opset versions "
                   f"{vers} (a kernel is used for every opset from its version up to the next)")
        else:
            msg = f"{what}{where} is not supported: the engine has no kernel for this operator"
        super().__init__(msg)


class InputError(WorkbenchError, ValueError):
    """Wrong inputs given to a model: count, name, dtype."""


class ShapeError(InputError):
    """An input's or a value's shape does not match what the model declares or an op needs."""


class SingaShapeError(ShapeError, AssertionError):
    """A shape check of SINGA's API (``autograd.mse_loss``, ``add_bias``, ``ranking_loss``...):
    SINGA raises AssertionError there and its users catch that; this is both."""


class KernelError(WorkbenchError, RuntimeError):
    """A kernel failed while running a node; names the node, op and input shapes."""

    def __init__(self, message: str, *, node_name: str | None = None, op_type: str | None = None):
        self.node_name = node_name
        self.op_type = op_type
        super().__init__(message)


class GradientError(WorkbenchError):
    """Autograd cannot differentiate through a node."""


class ExportError(WorkbenchError):
    """Something cannot be expressed in ONNX."""


class DownloadError(WorkbenchError):
    """A download failed or the network is not available."""


class ChecksumError(DownloadError):
    """A downloaded file's sha256 does not match the registry."""


class DeviceError(WorkbenchError):
    """The device asked for is not available or tensors live on different devices."""


class ResourceError(WorkbenchError, MemoryError):
    """An operation would exceed a resource limit (the memory budget for one value, the
    iteration ceiling of Loop/Scan, the time allowed for shape inference); refused before the
    resource is used. ``workbench.limits`` says how to raise the limits."""


class OverwriteError(ExportError, FileExistsError):
    """A save would replace an existing file and ``overwrite=True`` was not given."""
