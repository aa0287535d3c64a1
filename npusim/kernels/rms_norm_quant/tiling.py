"""Tiling of every step, as the host code of src/0..6 computes it (calcTiling,
calcMaxUbFactor, calcBinaryAddPoint)."""

from __future__ import annotations

from dataclasses import dataclass

from npusim.units import ceil_div

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
    """The step's tiling; ValueError (naming the largest r that fits) when its UB buffers
    do not fit ub_bytes."""
    if not 0 <= step <= 6:
        raise ValueError(f"step {step}: the sample has steps 0..6")
    t = _tiling(step, a, r, aiv_cores, ub_bytes)
    if t is None:
        buf = 1 if step < 4 else 2
        raise ValueError(f"{r}: step {step}'s UB buffers (x and y queues of {buf} slot"
                         f"{'s' if buf > 1 else ''}, gamma, work) do not fit the {ub_bytes} B "
                         f"UB; allowed: cols <= {max_cols(step, ub_bytes)} on this UB")
    return t


def max_cols(step: int, ub_bytes: int) -> int:
    """The largest r whose UB buffers fit (a multiple of 32; 0 if none does)."""
    lo, hi = 0, (1 << 16) // BLOCK_BYTES  # in blocks of 32 elements; lo fits (or is 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            fits = _tiling(step, 1, mid * BLOCK_BYTES, 1, ub_bytes) is not None
        except ValueError:  # step 6 outside the r it is modelled for: not a UB limit
            fits = mid * BLOCK_BYTES < VL_B32 * 2
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return lo * BLOCK_BYTES


def _tiling(step: int, a: int, r: int, aiv_cores: int, ub_bytes: int) -> RnqTiling | None:
    """calcTiling (and calcMaxUbFactor, calcBinaryAddPoint) of the step; None when its UB
    buffers do not fit ub_bytes (no ubFactor row in step 5 or 6, or one row of steps
    0-4)."""
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
    if uf <= 0 or ub_bytes_needed(step, ra, buf, uf) > ub_bytes:
        return None
    return RnqTiling(step, a, r, blocks, bf, tail, buf, uf, point, fold, fold_tail)


def ub_bytes_needed(step: int, ra: int, buf: int, uf: int) -> int:
    """The UB the step's program allocates (InitBuffer of each queue and TBuf): buf
    slots of uf rows of x (fp16) and y (int8), gamma as fp16 and float32, then steps 0-2's
    float32 x and rms rows and their reduce block, or steps 3-6's rms (one float32 per
    row, one register of partial sums per row in step 6)."""
    rows = buf * (ra * 2 * uf + ra * uf)
    gamma = ra * 2 + ra * 4
    if step <= 2:
        return rows + gamma + ra * 4 * 2 + BLOCK_BYTES
    per_row = VL_B32 * 4 if step == 6 else 4
    return rows + gamma + max(BLOCK_BYTES, -(-uf * per_row // BLOCK_BYTES) * BLOCK_BYTES)
