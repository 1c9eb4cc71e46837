"""`batchyard run`: a batch input file, or a sheet and a prompt, to an output file with no
server."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.config import Settings


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from app.offline import RunOptions, run_batch

    names = {f.name for f in fields(Settings)}
    name_model(args)
    sheet = sheet_spec(args)
    if isinstance(sheet, str):
        print(f"batchyard run: {sheet}", file=sys.stderr)
        return 2
    opts = RunOptions(
        input=args.input,
        output=args.output,
        errors=args.errors,
        state_dir=args.state_dir,
        endpoint=args.endpoint,
        resume=args.resume,
        sheet=sheet,
    )
    words = ["batchyard", *(sys.argv[1:] if argv is None else argv)]
    return run_batch(opts, {k: v for k, v in vars(args).items() if k in names}, argv=words)


def name_model(args: argparse.Namespace) -> None:
    """`--model` takes a file or a model's name: a name no file has (`gemma3:4b` from
    Ollama's store, an LM Studio or hub-cache model, a models.toml alias) becomes the
    run's default model, found by the catalog as serve finds it."""
    named = bool(args.model) and not Path(args.model).expanduser().exists()
    args.default_model = args.model if named else None
    if named:
        args.model = None


def sheet_spec(args: argparse.Namespace) -> Any:
    """The SheetSpec of `run` on a sheet or a folder of images, None for a JSONL input, or
    what is wrong (a str)."""
    from app.sheets.images import FOLDER_COLUMN
    from app.sheets.reading import is_sheet
    from app.sheets.requests import IMAGE_NAME, SheetSpec, parse_columns

    folder = args.input.is_dir()
    if not is_sheet(args.input.name) and not folder:
        if args.prompt is not None or args.columns or args.keep_reasoning:
            return (
                "--prompt, --columns and --keep-reasoning are for a sheet (.csv, .tsv, .xlsx) "
                "or a folder."
            )
        return None
    if args.prompt is None:
        what = (
            "a folder: give --prompt, what to ask of each image"
            if folder
            else "a sheet: give --prompt, a template over its columns"
        )
        return f"{args.input} is {what}."
    template = args.prompt
    if folder and f"{IMAGE_NAME}(" not in template:  # each image after the prompt's text
        template = f"{template}\n{{{{ {IMAGE_NAME}({FOLDER_COLUMN}) }}}}"
    return SheetSpec(
        template=template,
        system=args.system,
        model="",  # the run's default model, by its catalog id (offline.py names it)
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        output_columns=[c for text in args.columns for c in parse_columns(text)],
        sheet=args.sheet,
        keep_reasoning=args.keep_reasoning,
        # Image cells' paths are the sheet's neighbours (a folder's: its own files).
        folder=str((args.input if folder else args.input.parent).resolve()),
    )
