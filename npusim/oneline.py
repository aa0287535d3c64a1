"""argparse with one-line usage errors: the message and exit code 2, no usage block,
as every other bad input npusim (and its benchmarks) reports. Subcommand parsers made by
add_subparsers are of the same class, so theirs are one line too."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")
