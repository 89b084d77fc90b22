"""`tide` command line: extend, mine, serve, worker, keys, jobs.

Each subcommand lives in its own small module that registers its parser and imports its heavy
dependencies (torch, FastAPI, Celery) only when it runs, so `tide --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys

from extension.errors import InvalidOptionError, TideError
from extension.plan.options import option_error_for

from .cli_warnings import deprecations_logged


def build_parser() -> argparse.ArgumentParser:
    from . import cli_extend, cli_jobs, cli_mine, cli_service

    parser = argparse.ArgumentParser(prog="tide", description="Extend a language model's vocabulary with domain terms.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (cli_extend, cli_mine, cli_service, cli_jobs):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with deprecations_logged():  # third-party deprecation noise: logged, not printed
            return int(args.handler(args) or 0)
    except TideError as exc:
        message, param = option_error_for(exc, style="cli") if isinstance(exc, InvalidOptionError) else (exc.message, exc.param)
        where = f" ({param})" if param else ""
        print(f"tide: error{where}: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tide: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
