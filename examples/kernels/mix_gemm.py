"""mix_gemm: a MIX (1 AIC : 2 AIV) kernel on one device, y = relu(x @ w), to show the path
an AIC's result takes into the vector cores (docs/model.md, "AIC cube cores").

Per 64 x 64 tile of y (tiles round-robin over the blocks): the AIC copies the tile's
rows of x and columns of w into L1 128 columns of K at a time (MTE2), loads them into L0A
and L0B (MTE1) and accumulates the mmad into L0C; then it waits until both of its AIVs
have freed their UB tile (CrossCoreWaitFlag 1 from AIV0, 17 from AIV1: mode 4), FixPipes
the top 32 rows into AIV0's UB and the bottom 32 into AIV1's (fp32) and signals each
(CrossCoreSetFlag<4, PIPE_FIX> 0 and 16). Each AIV waits for its half, runs the epilogue
(ReLU and the cast to bf16) on its vector pipe, signals the AIC that its tile is free
and writes its 32 rows of y (MTE3).

The 950 only: FixPipe into UB and cross-core mode 4 are not paths of the A2/A3 presets.
`scenarios/examples/mix_gemm.yaml` runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from npusim.author import (
    Arrays,
    Family,
    Kernel,
    KernelContext,
    Misfit,
    Option,
    Phase,
    Strided,
    TensorSpec,
    Wait,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
TILE = 64  # rows and columns of y per tile
HALF = TILE // 2  # rows per AIV
K_STEP = 128  # columns of K per L1/L0 load
FREE, READY = 1, 0  # flag ids: AIV -> AIC "my UB tile is free", AIC -> AIV "your half is in"
AIV1 = 16  # mode 4: AIV1's ids as the AIC sees them and sets them


@dataclass(frozen=True)
class GemmTiling:
    m: int
    n: int
    k: int
    cores: int  # blocks launched (1 AIC + 2 AIV each)
    world: int = 1

    @property
    def tiles(self) -> list[tuple[int, int]]:
        return [(i * TILE, j * TILE) for i in range(self.m // TILE)
                for j in range(self.n // TILE)]

    def mine(self, block: int) -> list[tuple[int, int]]:
        return self.tiles[block::self.cores]


class NoWindow:
    def regions(self) -> dict[str, tuple[int, int]]:
        return {}


def aic_program(ctx: KernelContext, t: GemmTiling) -> Wait:
    x, w = ctx.tensor("x"), ctx.tensor("w")
    l1a = ctx.alloc("l1_a", TILE * K_STEP * 2, "l1")
    l1b = ctx.alloc("l1_b", K_STEP * TILE * 2, "l1")
    a = ctx.alloc("a", TILE * K_STEP * 2, "l0a")
    b = ctx.alloc("b", K_STEP * TILE * 2, "l0b")
    c = ctx.alloc("c", TILE * TILE * 4, "l0c")
    rows_a = Strided(TILE, K_STEP * 2, (t.k - K_STEP) * 2)  # 64 rows of 128 K
    rows_b = Strided(K_STEP, TILE * 2, (t.n - TILE) * 2)  # 128 rows of 64 N
    for m0, n0 in t.mine(ctx.block_idx):
        with ctx.phase("mmad"):
            for kc in range(t.k // K_STEP):
                k0 = kc * K_STEP
                yield from ctx.wait(
                    ctx.copy_in(l1a, x, (m0 * t.k + k0) * 2, 0, strided=rows_a, name="load_x"),
                    ctx.copy_in(l1b, w, (k0 * t.n + n0) * 2, 0, strided=rows_b, name="load_w"))
                yield from ctx.wait(ctx.load_data(a, l1a, a.nbytes),
                                    ctx.load_data(b, l1b, b.nbytes))
                yield from ctx.wait(ctx.mmad(c, a, b, TILE, TILE, K_STEP, "bfloat16",
                                             accumulate=kc > 0))
        with ctx.phase("fixpipe"):
            yield from ctx.cross_core_wait_flag(FREE)
            yield from ctx.cross_core_wait_flag(FREE + AIV1)
            for sub in (0, 1):
                ctx.fixpipe(ctx.peer_buffer(sub, "tile"), c, HALF, TILE, "float32",
                            src_offset=sub * HALF * TILE * 4)
                ctx.cross_core_set_flag(4, READY + sub * AIV1, "fixpipe")
            yield from ctx.pipe_barrier("fixpipe")  # L0C is free for the next tile


def aiv_program(ctx: KernelContext, t: GemmTiling) -> Wait:
    y = ctx.tensor("y")
    tile = ctx.alloc("tile", HALF * TILE * 4)
    out = ctx.alloc("out", HALF * TILE * 2)
    ctx.cross_core_set_flag(4, FREE)
    rows = Strided(HALF, TILE * 2, 0, (t.n - TILE) * 2)
    last = None
    for m0, n0 in t.mine(ctx.block_idx):
        with ctx.phase("epilogue"):
            yield from ctx.cross_core_wait_flag(READY)
            if last is not None:
                yield from ctx.wait(last)  # the previous tile's copy has read `out`

            def relu_cast() -> None:
                out.view(BF16)[:] = np.maximum(tile.view(np.float32), 0).astype(BF16)

            ctx.vector_seq("relu_cast", [("relu", HALF * TILE, np.float32),
                                         ("cast", HALF * TILE, np.float32)],
                           reads=[tile], writes=[out], fn=relu_cast)
            ctx.cross_core_set_flag(4, FREE, "vector")  # the tile is read: the AIC may refill
            yield from ctx.pipe_barrier("vector")
            row = m0 + ctx.sub_block_idx * HALF
            last = ctx.copy_out(y, (row * t.n + n0) * 2, out, 0, strided=rows, name="store_y")


class MixGemm(Kernel):
    name = "gemm"
    core_kind = "mix_aic_1_2"
    phases = (Phase("mmad", "AIC: MTE2 into L1, MTE1 into L0A/L0B, mmad into L0C"),
              Phase("fixpipe", "AIC: FixPipe L0C -> the AIVs' UB"),
              Phase("epilogue", "AIV 0 and 1: ReLU, cast, store their 32 rows"))
    inputs = (TensorSpec("x", lambda t: BF16, lambda t, r: (t.m, t.k), "[m, k] bf16"),
              TensorSpec("w", lambda t: BF16, lambda t, r: (t.k, t.n), "[k, n] bf16"))
    outputs = (TensorSpec("y", lambda t: BF16, lambda t, r: (t.m, t.n), "[m, n] relu(x @ w)"),)

    def launch_ns(self, hardware: Any) -> float | None:
        return hardware.kernel.task_launch_ns  # a plain task: no SHMEM set-up

    def program(self, t: GemmTiling) -> Any:
        def program(ctx: KernelContext) -> Wait:
            if ctx.core.kind.name == "aic":
                yield from aic_program(ctx, t)
            else:
                yield from aiv_program(ctx, t)
        return program


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """relu(x @ w) in fp32, cast to bf16 (the kernel's K steps add in another order)."""
    return np.maximum(x.astype(np.float32) @ w.astype(np.float32), 0).astype(BF16)


class MixGemmFamily(Family):
    name = "mix_gemm"
    help = "a MIX kernel example: y = relu(x @ w) on the cube with the AIVs' epilogue"
    ops = (MixGemm(),)
    runs = {"gemm": ("gemm",)}
    options = (
        Option("m", "int", 256, "rows of x and y, a multiple of 64", lo=64, hi=1 << 16),
        Option("n", "int", 256, "columns of w and y, a multiple of 64", lo=64, hi=1 << 16),
        Option("k_dim", "int", 512, "columns of x, rows of w, a multiple of 128", lo=128,
               hi=1 << 16),
    )

    def tiling(self, shape: None, options: Mapping[str, Any], hardware: Any,
               timing_only: bool = False) -> GemmTiling:
        tiles = (options["m"] // TILE) * (options["n"] // TILE)
        blocks = hardware.aic.cores if hardware.aic is not None else 1
        return GemmTiling(options["m"], options["n"], options["k_dim"],
                          max(1, min(blocks, hardware.chip.aiv_cores // 2, tiles)))

    def window(self, tiling: GemmTiling) -> NoWindow:
        return NoWindow()

    def misfit(self, shape: None, options: Mapping[str, Any], hardware: Any,
               op: str) -> Misfit | None:
        for key, step in (("m", TILE), ("n", TILE), ("k_dim", K_STEP)):
            if options[key] % step:
                return Misfit(f"workload.{key}", f"{options[key]} is not a multiple of {step}")
        aic = hardware.aic
        if aic is None or aic.fixpipe_ub_bytes_per_cycle <= 0 or "4" not in aic.flag_modes:
            return Misfit("hardware.aic", "mix_gemm needs AIC cores with FixPipe into UB and "
                          "cross-core mode 4 (the ascend950 preset)")
        return None

    def make_inputs(self, shape: None, options: Mapping[str, Any], op: str,
                    routing: Mapping[str, Any], payload: bool) -> list[Arrays]:
        m, n, k = options["m"], options["n"], options["k_dim"]
        rng = np.random.default_rng(routing.get("seed", 0))
        x = rng.uniform(-1, 1, (m, k)).astype(BF16)
        w = rng.uniform(-1, 1, (k, n)).astype(BF16) / np.float32(8)
        return [{"x": x, "w": w.astype(BF16)}]


FAMILY = MixGemmFamily()
