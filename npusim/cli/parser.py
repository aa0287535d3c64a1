"""The argparse tree of `npusim`: the top-level parser and the options every command
shares; each group of commands adds its own (in the order `npusim --help` lists them)."""

from __future__ import annotations

import argparse
from typing import Any

from npusim import __version__
from npusim.cli import advise, calibrate, catalogue, lint, regress, run, sweeps, tables


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


class _Version(argparse.Action):
    """--version: the version and whether the compiled core runs (a stale build of an
    editable install is not used, and a run is then slower)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from npusim.engine.compiled import describe

        print(f"npusim {__version__}\n{describe()}")
        parser.exit()


def build_parser(prog: str = "npusim") -> argparse.ArgumentParser:
    from npusim.oneline import OneLineParser

    parser = OneLineParser(
        prog=prog,
        description="Discrete-event simulator of Ascend NPUs running MoE dispatch/combine.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and which path runs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common()

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    for group in (run, lint, tables, calibrate, regress, sweeps, catalogue):
        group.add_parsers(add)
    advise.add_parser(sub)
    return parser
