"""The `batchyard` command: serve | worker | run | retry | engine | models | version."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

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
    command = _COMMANDS.get(args.command)
    if command is None:
        parser.print_help()
        return 2
    return command(args, argv)


def _version(_args: argparse.Namespace, _argv: list[str]) -> int:
    print(f"batchyard {__version__}")
    return 0


#: Each subcommand -> what runs it, given the parsed arguments and the command line.
_COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "serve": lambda args, _argv: serve(settings_of(args)),
    "worker": lambda args, _argv: worker(settings_of(args)),
    "run": run,
    "engine": lambda args, _argv: engine_command(args),
    "retry": lambda args, _argv: retry(settings_of(args), args.batch_id),
    "models": lambda args, _argv: models(settings_of(args), as_json=args.json),
    "version": _version,
}
