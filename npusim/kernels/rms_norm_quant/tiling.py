"""Tiling of every step, as the host code of src/0..6 computes it (calcTiling,
calcMaxUbFactor, calcBinaryAddPoint)."""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.common.align import ceil_div

BLOCK_BYTES = 32
VL_B32 = 64  # 256 B register / sizeof(float)


@dataclass(frozen=True)
class RnqTiling:
    step: int
    a: int
    r: int
    cores: int  # blockNum launched
    block_factor: int
    block_tail: int
    buf_num: int  # BUF_NUM of the x and y queues
    ub_factor: int  # rows per UB loop
    binary_add_point: int = 0
    fold_loops: int = 0
    fold_tail_loops: int = 0
    eps: float = 1e-6

    @property
    def r_align(self) -> int:
        """rAlign_ = CeilDiv(r, BLOCK_BYTES) * BLOCK_BYTES (elements)."""
        return ceil_div(self.r, BLOCK_BYTES) * BLOCK_BYTES

    @property
    def vf_loops(self) -> int:
        return ceil_div(self.r, VL_B32)

    def rows(self, core: int) -> int:
        return self.block_tail if core == self.cores - 1 else self.block_factor


def binary_add_point(r: int) -> int:
    """calcBinaryAddPoint: the smallest power of two >= ceil(r / 2), at least 8."""
    n = (r + 1) // 2
    power = BLOCK_BYTES // 4
    while power < n:
        power *= 2
    return power


def make_tiling(step: int, a: int, r: int, aiv_cores: int, ub_bytes: int) -> RnqTiling:
    if not 0 <= step <= 6:
        raise ValueError(f"step {step}: the sample has steps 0..6")
    core_num = 1 if step < 2 else aiv_cores  # steps 0, 1 launch <<<1>>>
    bf = ceil_div(a, core_num)
    blocks = ceil_div(a, bf)
    tail = a - bf * (blocks - 1)
    buf = 1 if step < 4 else 2
    ra = ceil_div(r, BLOCK_BYTES) * BLOCK_BYTES
    uf = 1
    point = fold = fold_tail = 0
    if step == 5:
        fixed = ra * (2 + 4) + BLOCK_BYTES
        linear = ra * (2 * buf + 1 * buf) + 4
        uf = (ub_bytes - fixed) // linear
    elif step == 6:
        point = binary_add_point(r)
        fold = ceil_div(r - point, VL_B32)
        fold_tail = point // VL_B32 - fold
        last_loops = 1 if r <= VL_B32 * VL_B32 * 2 else 2
        fixed = ra * (2 + 4)
        linear = ra * (2 * buf + 1 * buf) + last_loops * VL_B32 * 4
        uf = (ub_bytes - fixed) // linear
        if r < VL_B32 * 2 or last_loops != 1:
            raise ValueError("step 6 is modelled for 128 <= r <= 8192 (binaryAddLastLoops 1)")
    if uf <= 0:
        raise ValueError(f"UB space insufficient for r = {r}")
    return RnqTiling(step, a, r, blocks, bf, tail, buf, uf, point, fold, fold_tail)
