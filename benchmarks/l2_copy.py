"""A device-to-device copy on the 950 preset, with and without the die's L2 (docs/model.md,
"L2"): what the model predicts for a kernel larger than the L2.

    python benchmarks/l2_copy.py                  # 134217728 B in and out (67 M bf16)
    python benchmarks/l2_copy.py --bytes 33554432

Each of the 64 AIV cores walks its 1/64 of x in 48 KiB tiles: copy_in into one of two UB
buffers, wait for it, copy_out to y, and wait for a buffer's previous copy_out before
reusing it. The public measurement it is compared with (docs/calibration.md, "Where the
L2 model is wrong") is a copy kernel launched in a loop on an Ascend950PR_9589.
"""

from __future__ import annotations

import argparse
from typing import Any

from npusim.hw.config import load_hardware
from npusim.hw.machine import Machine
from npusim.runtime.launch import launch

TILE = 48 * 1024


def copy_us(nbytes: int, overrides: dict[str, Any]) -> tuple[float, int]:
    """The copy's duration (us) and the write bytes the L2 held."""
    cfg = load_hardware("ascend950", overrides)
    m = Machine(cfg, world=1)
    rank = m.ranks[0]
    rank.tensor("x", nbytes)
    rank.tensor("y", nbytes)
    share = nbytes // cfg.chip.aiv_cores

    def program(ctx: Any) -> Any:
        bufs = [ctx.alloc(f"tile{i}", TILE) for i in range(2)]
        outs: list[Any] = [None, None]
        base = ctx.core_id * share
        for i, off in enumerate(range(0, share, TILE)):
            n = min(TILE, share - off)
            if outs[i % 2] is not None:
                yield from ctx.wait(outs[i % 2])
            yield from ctx.wait(ctx.copy_in(bufs[i % 2], ctx.tensor("x"), base + off, n))
            outs[i % 2] = ctx.copy_out(ctx.tensor("y"), base + off, bufs[i % 2], n)
        for op in outs:
            if op is not None:
                yield from ctx.wait(op)

    res = launch(m, program, launch_ns=cfg.kernel.task_launch_ns)
    return (res.end_ns - res.start_ns) / 1e3, rank.stats().l2_held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=1 << 27, help="bytes copied (in and out)")
    args = ap.parse_args()
    for label, over in (("with the L2", {}), ("l2.bytes 0", {"l2.bytes": 0})):
        us, held = copy_us(args.bytes, over)
        print(f"{label:12s} {us:8.1f} us  {2 * args.bytes / us / 1e6:.3f} TB/s read+write"
              f"  L2 held {held / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
