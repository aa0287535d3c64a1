"""`python -m npusim`: the npusim command, whatever `npusim` on PATH is."""

import sys

from npusim.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m npusim"))
