"""The `batchyard` command: serve | worker | run | retry | engine | models | version."""

from __future__ import annotations

import sys

from app import __version__
from app.cli.commands import engine_command, models, retry
from app.cli.flags import CATALOG_FLAGS, SERVE_FLAGS, WORKER_FLAGS, settings_of
from app.cli.parser import build_parser
from app.cli.running import run
from app.cli.serving import database_problem, serve, worker
from app.engine.upstream import UPSTREAM_COMMAND
from app.toolchain.facts import SELFCHECK_COMMAND

__all__ = [
    "CATALOG_FLAGS",
    "SERVE_FLAGS",
    "WORKER_FLAGS",
    "build_parser",
    "database_problem",
    "main",
]


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
        return serve(settings_of(args))
    if args.command == "worker":
        return worker(settings_of(args))
    if args.command == "run":
        return run(args, argv)
    if args.command == "engine":
        return engine_command(args)
    if args.command == "retry":
        return retry(settings_of(args), args.batch_id)
    if args.command == "models":
        return models(settings_of(args), as_json=args.json)
    if args.command == "version":
        print(f"batchyard {__version__}")
        return 0
    parser.print_help()
    return 2
