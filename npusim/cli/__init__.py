"""The `npusim` command.

Exit codes (docs/report.md): 0 ok; 1 a check failed (compare, check, validate) or the
environment did; 2 bad input (scenario, preset, case directory, kernel file, command
line, output path) reported as one line, no traceback, no output files; 3 the simulated
kernel failed (sanitiser error, an exception in its program, deadlock, simulated-time or
wall-clock limit); 130 interrupted, saying what it left. --debug adds the traceback.

One module per concept: entry (main), parser (the argparse tree), guard (errors to one
line and an exit code), common (exit codes, shared option parsing), and one module per
group of commands: run, lint, tables (validate), calibrate, regress (compare, check),
sweeps (sweep, plot), catalogue (presets, scenarios), advise (its options; the ranking is
npusim.advise).
"""

from npusim.cli.common import EXIT_FAIL, EXIT_INPUT, EXIT_KERNEL, EXIT_OK
from npusim.cli.common import workers as _workers
from npusim.cli.entry import main
from npusim.cli.parser import build_parser

__all__ = ["EXIT_FAIL", "EXIT_INPUT", "EXIT_KERNEL", "EXIT_OK", "_workers", "build_parser", "main"]
