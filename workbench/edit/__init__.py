"""Model surgery: edit any ONNX model by hand or by code, every edit checked by running it,
undoable and replayable.

>>> from workbench import edit
>>> s = edit.open("model.onnx")                       # doctest: +SKIP
>>> s.rebatch("batch")                                # doctest: +SKIP
>>> s.add_output("/layer4/Relu_output_0")             # doctest: +SKIP
>>> s.undo(); s.redo()                                # doctest: +SKIP
>>> print(s.script())                                 # doctest: +SKIP
>>> s.save("model_dynamic.onnx")                     # doctest: +SKIP

Modules: ``session`` (the session, undo/redo, script, save), ``edits`` (nodes, values,
outputs, initializers, metadata, dims), ``compose`` (extract, cut, compose), ``reshape``
(re-shape / re-batch), ``opset`` (opset conversion), ``verify`` (the checks), ``records``
(the JSON-able records and the replay script), ``state`` (the model versions).
"""

from workbench.edit import compose as _compose  # noqa: F401  (registers its edits)
from workbench.edit import edits as _edits  # noqa: F401
from workbench.edit import opset as _opset  # noqa: F401
from workbench.edit import reshape as _reshape  # noqa: F401
from workbench.edit.errors import EditError
from workbench.edit.records import array
from workbench.edit.registry import EDITS, parameters
from workbench.edit.session import EditSession, Step, open  # noqa: A004
from workbench.edit.verify import Check

__all__ = ["open", "EditSession", "Step", "Check", "EditError", "EDITS", "parameters", "array"]
