"""The `batchyard` command: serve | worker | run | retry | engine | models | version."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import webbrowser
from dataclasses import fields
from pathlib import Path
from typing import Any

from app import __version__
from app.config import Settings, parse_gpu_layers
from app.engine.upstream import UPSTREAM_COMMAND
from app.toolchain.cuda import DEFAULT_ARCHS as DEFAULT_CUDA_ARCHS
from app.toolchain.facts import SELFCHECK_COMMAND

#: serve's flags: (flag, Settings field, type, help).
SERVE_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--host", "host", str, "address to bind"),
    ("--port", "port", int, "port to listen on"),
    (
        "--model",
        "model",
        str,
        "path to a .gguf model (default: the embedded SmolLM2-135M-Instruct)",
    ),
    (
        "--data-dir",
        "data_dir",
        str,
        "where the database and files live (default: the platform's user data dir)",
    ),
    (
        "--n-gpu-layers",
        "n_gpu_layers",
        parse_gpu_layers,
        "layers to offload to the GPU: a number, -1 (all) or auto (default: as many as the "
        "free VRAM holds, none without a GPU)",
    ),
    ("--parallel", "parallel", int, "sequences decoded together (0: 32 on CPU, 64 on GPU)"),
    ("--ctx-size", "ctx_size", int, "context per slot, in tokens"),
    ("--kv-cache-type", "kv_cache_type", str, "KV cache type: q8_0, f16, bf16 or q4_0"),
    (
        "--shared-prefix-cells",
        "shared_prefix_cells",
        int,
        "KV cells for batch lines that share a long block, forked from it in one stream "
        "(-1: 4 x ctx-size; 0: none)",
    ),
    ("--threads", "threads", int, "CPU threads for llama.cpp (0: every core)"),
    (
        "--engine-priority",
        "engine_priority",
        str,
        "the engine's CPU priority: low (the API and other programs go first), normal, or "
        "auto (low on a CPU, normal on a GPU)",
    ),
    (
        "--cpu-extra-buffers",
        "cpu_extra_buffers",
        str,
        "llama.cpp's extra CPU buffer types (AMX, repacked weights): auto (check once), on or off",
    ),
    (
        "--cache-dir",
        "cache_dir",
        str,
        "where the CPU check keeps its verdicts (default: the platform's user cache dir)",
    ),
    (
        "--api-keys-file",
        "api_keys_file",
        str,
        "file with one API key per line (optionally: KEY webhook_url=URL webhook_secret=whsec_...)",
    ),
    ("--webhook-url", "webhook_url", str, "where batch events are sent (Standard Webhooks)"),
    ("--webhook-secret", "webhook_secret", str, "the secret that signs webhooks (whsec_...)"),
    ("--log-level", "log_level", str, "debug, info, warning or error"),
    (
        "--database-url",
        "database_url",
        str,
        "SQLAlchemy URL: postgresql+psycopg://USER@HOST/DB shares one queue between nodes "
        "(default: SQLite in the data dir, one process)",
    ),
    (
        "--files-url",
        "files_url",
        str,
        "s3://BUCKET/PREFIX keeps file bytes in object storage every node reaches (credentials "
        "from the AWS environment, profile or role; default: the data dir)",
    ),
    (
        "--s3-endpoint",
        "s3_endpoint",
        str,
        "the S3-compatible store's URL when it is not AWS (MinIO, SeaweedFS, R2, Ceph)",
    ),
    (
        "--models-config",
        "models_config",
        str,
        "models.toml: per-model ctx_size, parallel, n_gpu_layers, kv_cache_type, chat_template "
        "and aliases (default: the data dir's models.toml, if any)",
    ),
    (
        "--default-model",
        "default_model",
        str,
        "the model of lines whose model names nothing known (default: the embedded SmolLM2)",
    ),
    (
        "--max-loaded-models",
        "max_loaded_models",
        int,
        "most models loaded at once (0: as many as the memory budget holds)",
    ),
    (
        "--models-memory",
        "models_memory",
        str,
        "memory for loaded models, as 8GiB (default: the free RAM less a margin, or the "
        "free VRAM on a GPU build)",
    ),
    ("--model-ttl", "model_ttl", str, "unload a model idle this long (10m, 1h; 0: never)"),
    (
        "--model-switch-after",
        "model_switch_after",
        str,
        "the longest another model's lines wait for the loaded model's queue to drain",
    ),
    (
        "--completion-windows",
        "completion_windows",
        str,
        "the completion windows a batch may ask for besides OpenAI's 24h, comma-separated, "
        "each from 1 hour to 7 days (90m, 1h, 48h, 7d)",
    ),
    ("--node-name", "node_name", str, "this node's name in claims, /health and /metrics"),
    (
        "--max-image-bytes",
        "max_image_bytes",
        int,
        "the largest image a line may hold, by data URL, file id or fetched URL, in bytes",
    ),
    (
        "--image-fetch-timeout",
        "image_fetch_timeout",
        float,
        "seconds an image URL's fetch may take, redirects included",
    ),
    (
        "--lease-seconds",
        "lease_seconds",
        int,
        "how long a claimed line may go unrenewed before another node takes it over",
    ),
]
#: What `batchyard worker` takes: a node runs lines; it serves no HTTP.
WORKER_FLAGS = (
    "model", "data_dir", "n_gpu_layers", "parallel", "ctx_size", "kv_cache_type",
    "shared_prefix_cells", "threads", "engine_priority", "cpu_extra_buffers", "cache_dir", "log_level", "database_url", "node_name",
    "lease_seconds", "files_url", "s3_endpoint", "models_config", "default_model",
    "max_loaded_models", "models_memory", "model_ttl", "model_switch_after",
    "max_image_bytes", "image_fetch_timeout",
    # A batch that ends on a worker queues its webhook there: the same endpoints as serve's.
    "api_keys_file", "webhook_url", "webhook_secret",
)  # fmt: skip


def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(Settings) if not callable(f.default_factory)}


def _add_engine_flags(p: argparse.ArgumentParser, names: tuple[str, ...]) -> None:
    defaults = _defaults()
    for flag, name, typ, text in SERVE_FLAGS:
        if name in names:
            shown = defaults.get(name)
            p.add_argument(
                flag,
                dest=name,
                type=typ,
                default=None,
                help=f"{text} [env {Settings.env_name(name)}; default: {shown!r}]",
            )


def _add_upstream_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        dest="engine",
        action="append",
        default=None,
        metavar="NAME=openai:URL[,key=K,models=a|b,concurrency=N]",
        help="an upstream OpenAI-compatible server (vLLM, SGLang, llama-server, Ollama, another "
        "batchyard) that serves the models it lists, or the ones named in models= (repeatable) "
        f"[env {Settings.env_name('engine')}, ';'-separated; default: none]",
    )
    p.add_argument(
        "--no-embedded",
        dest="no_embedded",
        action="store_true",
        default=None,
        help="do not load the embedded model: serve the --engine upstreams only, and answer "
        f"404 for other models [env {Settings.env_name('no_embedded')}=1; default: load it]",
    )


def _add_image_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-private-image-urls",
        dest="allow_private_image_urls",
        action="store_true",
        default=None,
        help="fetch image URLs on loopback, private and link-local addresses too "
        f"[env {Settings.env_name('allow_private_image_urls')}=1; default: public addresses only]",
    )


#: The catalog's settings (app/catalog/): where models are found and what a name means.
CATALOG_FLAGS = ("model", "data_dir", "models_config", "default_model")


def _add_catalog_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models-dir",
        dest="models_dir",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder of GGUF models (repeatable) "
        f"[env {Settings.env_name('models_dir')}, ':'-separated; default: DATA_DIR/models]",
    )
    p.add_argument(
        "--no-discover",
        dest="no_discover",
        action="store_true",
        default=None,
        help="do not read the home stores (Ollama, LM Studio, the Hugging Face cache) "
        f"[env {Settings.env_name('no_discover')}=1; default: read them]",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchyard",
        description="OpenAI's Files, Batch, Uploads and Responses APIs, on an embedded "
        "llama.cpp model or upstream OpenAI-compatible servers.",
    )
    parser.add_argument("--version", action="version", version=f"batchyard {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the server and open the dashboard")
    _add_engine_flags(serve, tuple(name for _, name, _, _ in SERVE_FLAGS))
    serve.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=None,
        help=f"an API key clients must send (repeatable) [env {Settings.env_name('api_keys')}, comma-separated; default: none, no key needed]",
    )
    _add_upstream_flags(serve)
    _add_image_flags(serve)
    _add_catalog_flags(serve)
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

    worker = sub.add_parser(
        "worker",
        help="run batch lines from a shared PostgreSQL queue, with no HTTP API",
        description="A node without the HTTP API: claims lines from the database that "
        "`batchyard serve` nodes share (--database-url postgresql+psycopg://…, the same "
        "--data-dir on a shared mount) and runs them on its model. Stops on SIGTERM.",
    )
    _add_engine_flags(worker, WORKER_FLAGS)
    _add_upstream_flags(worker)
    _add_image_flags(worker)
    _add_catalog_flags(worker)

    run = sub.add_parser(
        "run",
        help="run one batch input file (or a sheet and a prompt) to an output file, with no server",
        description="Run every line of a batch input JSONL file through the model and write "
        "the output JSONL (OpenAI's batch output format), with no server. "
        "Or give a sheet (.csv, .tsv, .xlsx) and --prompt: one request per row, and the sheet "
        "comes back (-o out.csv or out.xlsx) with the answers in new columns. "
        "Exit codes: 0 all lines succeeded; 1 the input failed validation; 2 usage error; "
        "3 done, but some lines failed (see the errors file); 130 interrupted (--resume).",
    )
    run.add_argument(
        "input", type=Path, help="the batch input file (.jsonl), or a sheet (.csv, .tsv, .xlsx)"
    )
    run.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="where to write the output .jsonl (for a sheet: a .csv or .xlsx)",
    )
    sheet = run.add_argument_group("a sheet's rows as requests (when the input is a sheet)")
    sheet.add_argument(
        "--prompt", default=None, help="the prompt template over the columns: '… {{ review }} …'"
    )
    sheet.add_argument("--system", default="", help="a system prompt (a template too)")
    sheet.add_argument(
        "--columns",
        action="append",
        default=[],
        metavar="NAME:TYPE",
        help="an output column, answered as JSON (repeat for more): NAME:text, NAME:number, "
        "NAME:boolean or 'NAME:one of a,b,c'; without any, the answer is one column",
    )
    sheet.add_argument("--sheet", default=None, help="the workbook's sheet (default: the first)")
    sheet.add_argument("--max-tokens", type=int, default=None, help="max_tokens of each request")
    sheet.add_argument(
        "--temperature", type=float, default=None, help="temperature of each request"
    )
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
    _add_engine_flags(
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
        ),
    )
    _add_image_flags(run)

    retry = sub.add_parser(
        "retry",
        help="make a new batch of a finished batch's failed lines",
        description="Make a new batch from the original input lines of BATCH_ID's failed lines "
        "(a new input file), linked both ways in metadata (retry_of, retried_by). A `batchyard "
        "serve` on the same data dir runs it.",
    )
    retry.add_argument("batch_id", help="the batch whose failed lines to run again")
    _add_engine_flags(retry, ("data_dir", "database_url"))

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
        _add_engine_flags(p, ("model", "threads", "cpu_extra_buffers", "cache_dir"))

    listing = sub.add_parser("models", help="list the models this install can serve")
    _add_engine_flags(listing, CATALOG_FLAGS)
    _add_catalog_flags(listing)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    sub.add_parser("version", help="print the version")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    names = {f.name for f in fields(Settings)}
    try:
        return Settings.load({k: v for k, v in vars(args).items() if k in names})
    except ValueError as exc:
        raise SystemExit(f"batchyard: {exc}") from None


def serve(settings: Settings) -> int:
    from app.auth.keys import keys_problem
    from app.files.backend import files_problem
    from app.files.storage import data_dir_problem

    if problem := (
        data_dir_problem(settings.data_path)
        or files_problem(settings)
        or keys_problem(settings)
        or database_problem(settings)
    ):
        print(f"batchyard: {problem}", file=sys.stderr)
        return 1
    import uvicorn

    from app.heap import freeze_startup
    from app.logs import LOG_FORMAT
    from app.server import create_app

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    app = create_app(settings)
    freeze_startup()  # the app and its modules, out of the collector's walks (app/heap.py)
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}/"
    print(
        f"batchyard {__version__}: dashboard {url}  API {url}v1  data {settings.data_path}",
        flush=True,
    )
    if not settings.no_browser:
        threading.Timer(1.0, lambda: webbrowser.open(url)).start()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
    return 0


def database_problem(settings: Settings) -> str | None:
    """Why the database cannot be used, or None. A SQLite file is taken for this process
    here, before anything starts (another process on it is refused with its pid)."""
    from app.db import DatabaseError, hold_sqlite_file, sqlite_file

    db_file = sqlite_file(settings.db_url)
    if db_file is None:
        return None
    try:
        hold_sqlite_file(db_file)  # held until the process ends
    except DatabaseError as exc:
        return str(exc)
    return None


def worker(settings: Settings) -> int:
    from app.files.backend import files_problem
    from app.files.storage import data_dir_problem
    from app.worker import run_worker

    if problem := (
        data_dir_problem(settings.data_path)
        or files_problem(settings)
        or database_problem(settings)
    ):
        print(f"batchyard: {problem}", file=sys.stderr)
        return 1
    return run_worker(settings)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from app.offline import RunOptions, run_batch

    names = {f.name for f in fields(Settings)}
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


def sheet_spec(args: argparse.Namespace) -> Any:
    """The SheetSpec of `run` on a sheet, None for a JSONL input, or what is wrong (a str)."""
    from app.config import default_model_path
    from app.sheets.reading import is_sheet
    from app.sheets.requests import SheetSpec, parse_column

    if not is_sheet(args.input.name):
        if args.prompt is not None or args.columns:
            return "--prompt and --columns are for a sheet (.csv, .tsv, .xlsx) input."
        return None
    if args.prompt is None:
        return f"{args.input} is a sheet: give --prompt, a template over its columns."
    model = Path(args.model) if args.model else default_model_path()
    return SheetSpec(
        template=args.prompt,
        system=args.system,
        model=model.stem if model.suffix == ".gguf" else model.name,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        output_columns=[parse_column(c) for c in args.columns],
        sheet=args.sheet,
    )


def engine_command(args: argparse.Namespace) -> int:
    from app.toolchain import build

    if args.engine_command == "build":
        backend = args.backend or "cpu"
        if args.cuda_arch and backend != "cuda":
            print("batchyard engine build: --cuda-arch goes with --cuda", file=sys.stderr)
            return 2
        return build.build(
            backend, _settings(args), sys.stdout, wheel=args.wheel, cuda_arch=args.cuda_arch
        )
    if args.engine_command == "status":
        for line in build.status(_settings(args), check=args.check).lines():
            print(line)
        return 0
    print("usage: batchyard engine build [--cpu|--cuda|--metal|--vulkan] | batchyard engine status")
    return 2


def retry(settings: Settings, batch_id: str) -> int:
    from app.errors import APIError
    from app.services import build_services

    services = build_services(settings)
    try:
        owner = services.batches.owner_of(batch_id)
        new = services.batches.retry(batch_id, owner)
    except APIError as exc:
        print(f"batchyard retry: {exc.message}", file=sys.stderr)
        return 1
    finally:
        services.db.close()
    print(f"{new.id}")
    print(
        f"batchyard retry: {new.id} runs the failed lines of {batch_id} again "
        f"(metadata retry_of={batch_id}; {batch_id} has retried_by={new.id}). "
        f"`batchyard serve --data-dir {settings.data_path}` runs it.",
        file=sys.stderr,
    )
    return 0


def models(settings: Settings, *, as_json: bool = False) -> int:
    """Every model the catalog finds: its id, source, size, quantization, architecture,
    trained context, the memory it is estimated to take at its load profile and whether it
    takes images (has a projector)."""
    import json

    from app.catalog import Catalog
    from app.catalog.estimate import human_size

    try:
        entries = Catalog(settings).entries()
    except ValueError as exc:  # a bad models.toml, an unknown --default-model
        print(f"batchyard: {exc}", file=sys.stderr)
        return 1
    if as_json:
        rows = [
            {
                "id": e.id,
                "names": sorted(e.names),
                "source": e.source,
                "path": str(e.path),
                "size_bytes": e.size_bytes,
                "quantization": e.quantization,
                "architecture": e.architecture,
                "context_length": e.context_length,
                "estimated_bytes": e.estimate.total if e.estimate else None,
                "projector": str(e.projector) if e.projector else None,
                "ctx_size": e.profile.ctx_size,
                "parallel": e.profile.parallel,
                "kv_cache_type": e.profile.kv_cache_type,
                "default": e.is_default,
                "error": e.error,
            }
            for e in entries
        ]
        print(json.dumps(rows, indent=2))
        return 0
    header = ("ID", "SOURCE", "SIZE", "QUANT", "ARCH", "CONTEXT", "MEMORY", "INPUT")
    table = [header]
    for e in entries:
        memory = human_size(e.estimate.total) if e.estimate else "-"
        table.append(
            (
                e.id + (" *" if e.is_default else ""),
                e.source,
                human_size(e.size_bytes) if e.size_bytes else "missing",
                e.quantization,
                e.architecture or "-",
                str(e.context_length) if e.context_length else "-",
                memory,
                "text+image" if e.projector else "text",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {2, 5, 6}  # numbers line up on the right
    for row in table:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    for e in entries:
        if e.error:
            print(f"{e.id}: {e.error} ({e.path})", file=sys.stderr)
    print(
        "* the default model. MEMORY: weights + KV cache + compute buffers (and a projector's "
        "share), estimated at each model's context x parallel (the server's flags, or "
        "models.toml's). INPUT: text+image for a model with a multimodal projector (mmproj).",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SELFCHECK_COMMAND]:  # a model check's child process in a frozen app
        from app.engine.llama import selfcheck

        return selfcheck.main(argv[1:])
    if argv[:1] == [UPSTREAM_COMMAND]:  # an upstream's client process in a frozen app
        from app.engine.upstream import child

        return child.main()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(_settings(args))
    if args.command == "worker":
        return worker(_settings(args))
    if args.command == "run":
        return run(args, argv)
    if args.command == "engine":
        return engine_command(args)
    if args.command == "retry":
        return retry(_settings(args), args.batch_id)
    if args.command == "models":
        return models(_settings(args), as_json=args.json)
    if args.command == "version":
        print(f"batchyard {__version__}")
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
