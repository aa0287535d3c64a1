"""CANN's NPU Simulator is also a command named `npusim` (since CANN's 2026-07-30 release;
formerly `cannsim`, kept as an alias), with the subcommands `record` and `report`, and
CANN's set_env.sh puts it on PATH. Whichever `npusim` comes first on PATH shadows the other.
When this one is asked for CANN's subcommands, say which simulator answered and where
CANN's is: `<toolkit>/bin/npusim`, the toolkit being $ASCEND_HOME_PATH (or
$ASCEND_TOOLKIT_HOME), both set by set_env.sh.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

SUBCOMMANDS = ("record", "report")  # CANN's NPU Simulator's; npusim has neither
HOME_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
# default installs since CANN 8.5 (<install>/cann, root and non-root) and before it
# (<install>/ascend-toolkit/latest); set_env.sh sits in <install>/cann resp. ascend-toolkit
DEFAULT_HOMES = ("/usr/local/Ascend/cann", "~/Ascend/cann",
                 "/usr/local/Ascend/ascend-toolkit/latest")


def cann_npusim(env: Mapping[str, str], homes: Sequence[str] = DEFAULT_HOMES
                ) -> tuple[str, bool]:
    """Where CANN's npusim is (or would be) and whether that file exists."""
    for var in HOME_VARS:
        if env.get(var):
            path = Path(env[var]) / "bin" / "npusim"
            return str(path), path.is_file()
    for home in homes:
        path = Path(home).expanduser() / "bin" / "npusim"
        if path.is_file():
            return str(path), True
    return "$ASCEND_HOME_PATH/bin/npusim", False


def wrong_simulator(subcommand: str, env: Mapping[str, str] | None = None,
                    homes: Sequence[str] = DEFAULT_HOMES) -> str:
    """The one line for `npusim record|report ...` reaching this simulator."""
    path, exists = cann_npusim(os.environ if env is None else env, homes)
    if exists:
        reach = f"run CANN's as {path} {subcommand} ..."
    elif path.startswith("$"):
        reach = (f"source CANN's set_env.sh ({DEFAULT_HOMES[0]}/set_env.sh for a root "
                 f"install), then run $ASCEND_HOME_PATH/bin/npusim {subcommand} ... "
                 "(check with `ls $ASCEND_HOME_PATH/bin`)")
    else:
        reach = (f"CANN's would be {path}, which is not there: look with "
                 "`ls $ASCEND_HOME_PATH/bin` (releases before 2026-07-30 call it cannsim)")
    return (f"npusim: '{subcommand}' is a command of CANN's NPU Simulator, but this npusim "
            f"is the MoE dispatch/combine simulator (also `npusim-moe`); {reach}, or put "
            "CANN's bin/ first on PATH")
