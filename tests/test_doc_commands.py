"""The docs' console blocks run as written (executable docs, as SimPy's docs are doctests).

A ```console block holds `$ npusim ...` lines; the lines under a command are fragments of
what it prints, in order (`...` stands for any text), and `# exit N` after a command is the
exit status the docs promise (0 when absent). A block's commands run one after another in
a fresh folder, so a later command may read what an earlier one wrote (`out/...`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *(ROOT / "docs" / n for n in ("install.md", "scenario.md",
                                                             "commands.md")))
"""The pages whose console blocks run here (the README's tour, the one-line errors)."""

SLOW = ("check", "sweep", "calibrate", "validate")
"""Subcommands too slow for a doc test: a console block must not show them."""


@dataclass
class Command:
    argv: list[str]
    exit_code: int
    expected: list[str] = field(default_factory=list)


def console_blocks(path: Path) -> list[list[Command]]:
    """Every ```console block of a page as its commands with their expected output."""
    blocks: list[list[Command]] = []
    inside, indent = False, 0
    for raw in path.read_text().splitlines():
        line = raw[indent:] if inside else raw
        if raw.strip() == "```console":  # a block may be indented, inside a list item
            inside, indent, cmds = True, len(raw) - len(raw.lstrip()), []
            blocks.append(cmds)
        elif inside and line.strip() == "```":
            inside = False
        elif inside and line.startswith("$ "):
            text, _, note = line[2:].partition("  #")
            m = re.fullmatch(r"\s*exit (\d+)\s*", note)
            cmds.append(Command(shlex.split(text), int(m.group(1)) if m else 0))
        elif inside and line.strip():
            cmds[-1].expected.append(line.rstrip())
    return blocks


def _pattern(fragment: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in fragment.split("...")))


def missing(expected: list[str], output: str) -> list[str]:
    """The expected lines not found, in order, among the output's lines."""
    lines = iter(line.rstrip() for line in output.splitlines())
    return [want for want in expected
            if not any(_pattern(want).fullmatch(got) for got in lines)]


CASES = [(f"{path.relative_to(ROOT)}#{i}", block)
         for path in DOCS for i, block in enumerate(console_blocks(path))]


def test_the_docs_have_their_console_blocks():
    names = {c.argv[1] for _, block in CASES for c in block}
    assert {"scenarios", "run", "compare", "lint", "presets"} <= names
    assert all(c.argv[0] == "npusim" and c.argv[1] not in SLOW for _, b in CASES for c in b)


def test_missing_reads_fragments_in_order():
    out = "a: latency 16.3 us\nverdict: ok\n"
    assert missing(["a: latency ... us", "verdict: ..."], out) == []
    assert missing(["verdict: ...", "a: latency ... us"], out) == ["a: latency ... us"]
    assert missing(["latency"], out) == ["latency"]  # a whole line, not a substring


@pytest.mark.parametrize("name, block", CASES, ids=[n for n, _ in CASES])
def test_console_block_runs_as_documented(name: str, block: list[Command], tmp_path: Path):
    for cmd in block:
        done = subprocess.run([sys.executable, "-m", "npusim", *cmd.argv[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        said = f"{name}: $ {shlex.join(cmd.argv)}\n{done.stdout}{done.stderr}"
        assert done.returncode == cmd.exit_code, said
        assert "Traceback" not in done.stderr, said
        assert missing(cmd.expected, done.stdout + done.stderr) == [], said
