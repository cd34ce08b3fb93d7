"""``workbench edit``: the common edits from the command line, each checked like in Python.

    workbench edit model.onnx -o model_b8.onnx --batch 8
    workbench edit model.onnx -o dyn.onnx --batch batch --shape input_ids=batch,128
    workbench edit model.onnx -o feat.onnx --cut-after /avgpool/GlobalAveragePool_output_0
    workbench edit model.onnx -o m18.onnx --opset 18 --rename input=image --script edits.py

Edits run in this order: renames, outputs added, cut, shapes, batch, opset. Every step and
its check is printed; nothing is written when an edit is refused.
"""

from __future__ import annotations

import argparse
import os


def add_edit_parser(sub) -> None:
    e = sub.add_parser("edit", help="edit a model (batch, input shapes, outputs, opset...), "
                                    "every edit checked by running it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("model", help="path to an .onnx file")
    e.add_argument("-o", "--output", required=True, help="where to write the edited model")
    e.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    e.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="rename a value (input, output, initializer or inner value)")
    e.add_argument("--add-output", action="append", default=[], metavar="VALUE",
                   help="make an inner value a graph output")
    e.add_argument("--cut-after", action="append", default=[], metavar="VALUE",
                   help="keep what computes VALUE (repeatable: several outputs)")
    e.add_argument("--shape", action="append", default=[], metavar="INPUT=D0,D1,...",
                   help="new input shape (ints, or names for symbolic dims); baked constants "
                        "are rewritten")
    e.add_argument("--batch", metavar="N|NAME", help="new batch size, or a name (symbolic)")
    e.add_argument("--opset", type=int, help="convert to this ai.onnx opset")
    e.add_argument("--static", action="store_true",
                   help="only onnx.checker and shape inference (do not run the model)")
    e.add_argument("--script", metavar="FILE.py", help="also write the replay script")
    e.set_defaults(func=cmd_edit)


def _pair(text: str, what: str) -> tuple[str, str]:
    from workbench.edit.errors import EditError  # noqa: PLC0415
    if "=" not in text:
        raise EditError(f"{what} is NAME=VALUE, got {text!r}")
    a, b = text.split("=", 1)
    return a, b


def _dim(text: str):
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else text


def cmd_edit(args) -> int:
    from workbench import edit  # noqa: PLC0415
    from workbench.files import write_atomic  # noqa: PLC0415

    if os.path.exists(args.output) and not args.overwrite:
        raise edit.EditError(f"{args.output} already exists; pass --overwrite to replace it")
    s = edit.open(args.model, check="static" if args.static else "run")
    for r in args.rename:
        old, new = _pair(r, "--rename")
        print(s.rename_value(old, new))
    for v in args.add_output:
        print(s.add_output(v))
    if args.cut_after:
        print(s.cut_after(args.cut_after))
    if args.shape:
        shapes = {}
        for spec in args.shape:
            name, dims = _pair(spec, "--shape")
            shapes[name] = [_dim(d) for d in dims.split(",")]
        print(s.reshape_inputs(shapes))
    if args.batch is not None:
        print(s.rebatch(_dim(args.batch)))
    if args.opset is not None:
        print(s.set_opset(args.opset))
    if not s.steps:
        raise edit.EditError("no edit given (see workbench edit -h)")
    s.save(args.output, overwrite=args.overwrite)
    print(f"wrote {args.output}")
    if args.script:
        code = s.script(save_to=args.output)
        write_atomic(args.script, lambda f: f.write(code.encode()), overwrite=args.overwrite)
        print(f"wrote {args.script}")
    return 0
