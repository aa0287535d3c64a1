"""`python -m npusim.cli`: the npusim command (as `python -m npusim`)."""

import sys

from npusim.cli.entry import main

if __name__ == "__main__":
    sys.exit(main())
