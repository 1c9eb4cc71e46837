"""The `batchyard` command's parser: its subcommands and their flags."""

from __future__ import annotations

import argparse
from pathlib import Path

from app import __version__
from app.cli.flags import (
    CATALOG_FLAGS,
    SERVE_FLAGS,
    WORKER_FLAGS,
    add_catalog_flags,
    add_engine_flags,
    add_image_flags,
    add_upstream_flags,
)
from app.config import Settings
from app.toolchain.cuda import DEFAULT_ARCHS as DEFAULT_CUDA_ARCHS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchyard",
        description="OpenAI's Files, Batch, Uploads and Responses APIs, on an embedded "
        "llama.cpp model or upstream OpenAI-compatible servers.",
    )
    parser.add_argument("--version", action="version", version=f"batchyard {__version__}")
    sub = parser.add_subparsers(dest="command")

    _add_serve(sub)
    _add_worker(sub)
    _add_run(sub)
    _add_retry(sub)
    _add_engine(sub)
    _add_models(sub)
    sub.add_parser("version", help="print the version")
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard serve`: the server, its engines, keys and catalog."""
    serve = sub.add_parser("serve", help="run the server and open the dashboard")
    add_engine_flags(serve, tuple(name for _, name, _, _ in SERVE_FLAGS))
    serve.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=None,
        help=f"an API key clients must send (repeatable) [env {Settings.env_name('api_keys')}, comma-separated; default: none, no key needed]",
    )
    add_upstream_flags(serve)
    add_image_flags(serve)
    add_catalog_flags(serve)
    serve.add_argument(
        "--strict-models",
        dest="strict_models",
        action="store_true",
        default=None,
        help="fail batch lines whose model names nothing known (model_not_found) instead of "
        f"running them on the default model [env {Settings.env_name('strict_models')}=1; "
        "default: run them]",
    )
    serve.add_argument(
        "--no-browser",
        dest="no_browser",
        action="store_true",
        default=None,
        help=f"do not open the browser [env {Settings.env_name('no_browser')}=1; default: open it]",
    )


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard worker`: a node with no HTTP API."""
    worker = sub.add_parser(
        "worker",
        help="run batch lines from a shared PostgreSQL queue, with no HTTP API",
        description="A node without the HTTP API: claims lines from the database that "
        "`batchyard serve` nodes share (--database-url postgresql+psycopg://…, the same "
        "--data-dir on a shared mount) and runs them on its model. Stops on SIGTERM.",
    )
    add_engine_flags(worker, WORKER_FLAGS)
    add_upstream_flags(worker)
    add_image_flags(worker)
    add_catalog_flags(worker)


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard run`: one input file (a JSONL, a sheet or a folder) with no server."""
    run = sub.add_parser(
        "run",
        help="run one batch input file (or a sheet, or a folder of images, and a prompt) to an "
        "output file, with no server",
        description="Run every line of a batch input JSONL file through the model and write "
        "the output JSONL (OpenAI's batch output format), with no server. "
        "Or give a sheet (.csv, .tsv, .xlsx) and --prompt: one request per row, and the sheet "
        "comes back (-o out.csv or out.xlsx) with the answers in new columns; a column of "
        "images is placed with {{ image(column) }} (a path next to the sheet, a URL or a file "
        "id). Or give a folder and --prompt: one request per image (.png, .jpg, .jpeg, .webp, "
        ".gif, by name), and a sheet of file names and answers comes back. "
        "Exit codes: 0 all lines succeeded; 1 the input failed validation; 2 usage error; "
        "3 done, but some lines failed (see the errors file); 130 interrupted (--resume).",
    )
    run.add_argument(
        "input",
        type=Path,
        help="the batch input file (.jsonl), a sheet (.csv, .tsv, .xlsx) or a folder of images",
    )
    run.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="where to write the output .jsonl (for a sheet or a folder: a .csv or .xlsx)",
    )
    _add_sheet_flags(run)
    run.add_argument(
        "--errors",
        type=Path,
        default=None,
        help="where to write the failed lines (default: OUTPUT.errors.jsonl, when any fail)",
    )
    run.add_argument(
        "--endpoint",
        default=None,
        help="the batch's endpoint (default: the `url` of the input's lines)",
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the run keeps its database and files (default: OUTPUT.batchyard-state/)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from its state dir; finished lines are not redone",
    )
    add_engine_flags(
        run,
        (
            "model",
            "n_gpu_layers",
            "parallel",
            "ctx_size",
            "kv_cache_type",
            "threads",
            "engine_priority",
            "cpu_extra_buffers",
            "cache_dir",
            "log_level",
            "max_image_bytes",
            "image_fetch_timeout",
            "models_config",
            "reasoning_field",
            "reasoning_budget",
        ),
    )
    # The catalog's stores, as serve reads them: `--model gemma3:4b` names one of them.
    add_catalog_flags(run)
    add_image_flags(run)


def _add_sheet_flags(run: argparse.ArgumentParser) -> None:
    """`batchyard run`'s flags for a sheet's rows, or a folder's images, as requests."""
    sheet = run.add_argument_group(
        "a sheet's rows (or a folder's images) as requests (when the input is one)"
    )
    sheet.add_argument(
        "--prompt",
        default=None,
        help="the prompt template over the columns: '… {{ review }} …', '{{ image(photo) }}'; "
        "for a folder, the prompt each image follows (its name is {{ file }})",
    )
    sheet.add_argument("--system", default="", help="a system prompt (a template too)")
    sheet.add_argument(
        "--columns",
        action="append",
        default=[],
        metavar="NAME:TYPE",
        help="output columns, answered as JSON, comma-separated or repeated: NAME (text), "
        "NAME:number, NAME:boolean, NAME:list (strings; its cell holds them as a JSON array) "
        "or 'NAME:one of a,b,c' (last in its list); without any, the answer is one column",
    )
    sheet.add_argument("--sheet", default=None, help="the workbook's sheet (default: the first)")
    sheet.add_argument("--max-tokens", type=int, default=None, help="max_tokens of each request")
    sheet.add_argument(
        "--temperature", type=float, default=None, help="temperature of each request"
    )
    sheet.add_argument(
        "--keep-reasoning",
        action="store_true",
        help="add a `reasoning` column with a thinking model's thought (the answer's columns "
        "are filled from its answer alone either way)",
    )


def _add_retry(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard retry`: a new batch of a finished batch's failed lines."""
    retry = sub.add_parser(
        "retry",
        help="make a new batch of a finished batch's failed lines",
        description="Make a new batch from the original input lines of BATCH_ID's failed lines "
        "(a new input file), linked both ways in metadata (retry_of, retried_by). A `batchyard "
        "serve` on the same data dir runs it.",
    )
    retry.add_argument("batch_id", help="the batch whose failed lines to run again")
    add_engine_flags(retry, ("data_dir", "database_url"))


def _add_engine(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard engine build | status`: llama-cpp-python's build."""
    engine = sub.add_parser(
        "engine", help="build llama-cpp-python for this machine, or say how it is built"
    )
    engine_sub = engine.add_subparsers(dest="engine_command")
    build = engine_sub.add_parser(
        "build",
        help="rebuild llama-cpp-python in batchyard's environment (the fast build)",
        description="Rebuild llama-cpp-python at the version batchyard pins, inside batchyard's "
        "own environment, with the AMX fix header and the backend's flags; then check it (the "
        "CPU check, or one layer on the GPU) and go back to the previous build if that fails.",
    )
    which = build.add_mutually_exclusive_group()
    for name in ("cpu", "cuda", "metal", "vulkan"):
        which.add_argument(
            f"--{name}",
            dest="backend",
            action="store_const",
            const=name,
            help=f"build for {name.upper() if name != 'metal' else 'Metal'}"
            + (" (the default)" if name == "cpu" else ""),
        )
    build.add_argument(
        "--cuda-arch",
        default=None,
        metavar="ARCH",
        help='with --cuda: the GPU architectures to compile for, like 90 or "80;89;90" '
        "(default: the visible GPUs', else " + ";".join(DEFAULT_CUDA_ARCHS) + " as far as "
        "this nvcc supports them)",
    )
    build.add_argument(
        "--wheel",
        default=None,
        help="install this prebuilt wheel (or a wheelhouse dir's) instead of compiling "
        "[env BATCHYARD_ENGINE_WHEELHOUSE]",
    )
    engine_status = engine_sub.add_parser(
        "status", help="which backend and CPU buffer types are in use, and why"
    )
    engine_status.add_argument(
        "--check", action="store_true", help="run the CPU check now if it has no cached verdict"
    )
    for p in (build, engine_status):
        add_engine_flags(p, ("model", "threads", "cpu_extra_buffers", "cache_dir"))


def _add_models(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`batchyard models`: the models this install can serve."""
    listing = sub.add_parser("models", help="list the models this install can serve")
    add_engine_flags(listing, CATALOG_FLAGS)
    add_catalog_flags(listing)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
