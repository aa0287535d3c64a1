"""GetCumSum's last step, as the MC2 dispatch kernels write it: once a core has read column m
of the cum-sum cores' partial sums, it zeroes its UB copy and writes it back over the column,
so the next call of the operator polls fresh flags."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np

from npusim.kernels.common.status import StatusLayout
from npusim.runtime.context import KernelContext, Strided
from npusim.units import ceil_div


def clear_cum_sum_column(
    ctx: KernelContext, status: StatusLayout, column: Any, n_cs: int, m: int
) -> Generator[Any, Any, None]:
    """Zero `column` (n_cs 32 B entries in UB) and write it over column m of the window's
    cum-sum region, one entry per cum-sum core's row."""
    ctx.vector(
        "clear_column",
        repeats=ceil_div(n_cs, 8),
        writes=[column],
        fn=lambda: column.view(np.uint8).fill(0),
    )
    yield from ctx.pipe_barrier("vector")
    ctx.copy_out(
        ctx.window(),
        status.cumsum_cal(n_cs, 0, m),
        column,
        0,
        strided=Strided(n_cs, 32, dst_gap=(n_cs - 1) * 32),
        name="clear_partials",
    )
