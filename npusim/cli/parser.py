"""The argparse tree of `npusim`: the top-level parser and the options every command
shares; each group of commands adds its own (in the order `npusim --help` lists them)."""

from __future__ import annotations

import argparse
from typing import Any

from npusim import __version__, advise_cmd
from npusim.cli import calibrate, catalogue, lint, regress, run, sweeps, tables


def _common() -> argparse.ArgumentParser:
    """The options of every command (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the Python traceback before the one-line "
        "message (a kernel error: the traceback of the kernel's exception)",
    )
    return common


def build_parser(prog: str = "npusim") -> argparse.ArgumentParser:
    from npusim.oneline import OneLineParser

    parser = OneLineParser(
        prog=prog,
        description="Discrete-event simulator of Ascend NPUs running MoE dispatch/combine.",
    )
    parser.add_argument("--version", action="version", version=f"npusim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common()

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    for group in (run, lint, tables, calibrate, regress, sweeps, catalogue):
        group.add_parsers(add)
    advise_cmd.add_parser(sub)
    return parser
