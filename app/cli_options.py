"""CLI flags for job options, generated from extension.plan.options (defaults, ranges and help live there)."""

from __future__ import annotations

import argparse

from extension.plan.options import BY_NAME, OPTIONS


def add_option_flags(parser: argparse.ArgumentParser, names: list[str] | None = None) -> None:
    """One flag per option (default: every option), with its default and range in the help."""
    for option in OPTIONS if names is None else [BY_NAME[name] for name in names]:
        parser.add_argument(
            option.cli_flag, dest=option.name, type=option.kind, default=option.unset_default,
            help=f"{option.help}; {option.valid_range()} (default: {option.default_text})",
        )


def option_values(args: argparse.Namespace, names: list[str] | None = None) -> dict:
    """The parsed options as ExtendSpec keyword arguments."""
    return {option.name: getattr(args, option.name) for option in OPTIONS if (names is None or option.name in names)}
