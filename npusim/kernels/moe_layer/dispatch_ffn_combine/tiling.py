"""DispatchFFNCombine's host tiling and refusals (sgl-kernel-npu csrc/deepep/ops/op_host/
dispatch_ffn_combine_tiling.cpp, op_kernel/dispatch_ffn_combine.h), and the moe_init_routing
tiling the host computes for the kernel's routing step
(op_kernel/dispatch_ffn_combine_kernel/moe_init_routing_quant_v2/*_tiling.h).

Sizes, with M = BS (x's rows), N = 2I (w1's last dim), K = H:
- maxOutputSize = BS * topK * W, the test's value (test_dispatch_ffn_combine.py 390-401):
  no rank ever receives more, so the kernel's truncation of rows past it never happens
  and is not modelled (a smaller value is not an option);
- GMM tiles (dispatch_ffn_combine.h 185-226): L1 128 x 256 x 512, L0 128 x 256 x 128,
  swizzle GemmIdentityBlockSwizzle<9, 1>; the host's CoCTiling m0/k0/n0 (tiling.cpp 154-165)
  are not what the kernel runs;
- epilogue 1: epilogueCoreNum = aivNum / 2, epilogueGranularity = expertPerRank - 1
  (dispatch_ffn_combine.h 241-242);
- the routing step runs the full-load dynamic-quant kernel (tiling key 21000) when the
  sort and a row fit the 196352 B UB the host assumes (tiling.cpp 221-232,
  IsFullLoad / IsFullLoadDynamicQuant), else, while BS * topK fits one sort
  (sortLoopMaxElement), tiling key 11000: the one-core sort, then the split count, scatter
  and gather (routing_quant.py), whose row indices and 21 rows of H (H <= 8192, the
  family's limit) always fit one loop (Tiling4GatherDynamicQuant); its gather splits
  BS * topK routes over 2 * BLOCK_NUM = 40 AIVs (Tiling4GatherDynamicQuant), whatever
  the launch has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npusim.kernels.family import Misfit
from npusim.kernels.moe_layer.tiling import GmmTiling
from npusim.units import MiB, align_up, ceil_div
from npusim.workload.shape import MoeShape

SRC = "sgl-kernel-npu csrc/deepep/ops/op_host/dispatch_ffn_combine_tiling.cpp"
L1_M, L1_N, L1_K, L0_K = 128, 256, 512, 128
SWIZZLE_OFFSET = 9
ROUTING_AIV = 40  # 2 * BLOCK_NUM (tiling.cpp:36, 229)
ROUTING_UB = 196352  # the UB the host hands the routing tiling (tiling.cpp:222)
MAX_COLS_ONE_LOOP_QUANT = 8192
FULLLOAD_COLS_BUFFER = 13  # DYNAMIC_QUANT_FULLLOAD_COLS_BUFFER
ONE_CORE_SORT_BUFFER = 6
SORT32 = 32
ALIGN_512 = 512  # a routed row in the segment: H int8 + 512 B (its fp32 scale at H)
COUNT_ALIGN = 128  # tokenPerExpert rows: AlignUp(EP * expertPerRank, 128) int32
FLAG_MAX_SET_COUNT = 15  # CROSS_CORE_FLAG_MAX_SET_COUNT (utils/const_args.hpp)
DEFAULT_BUFFSIZE_MB = 200


def _block(n: int) -> int:
    return align_up(n, 32)


def sort_loop_max() -> int:
    """sortLoopMaxElement (moe_init_routing_v2_tiling.h DoOpTiling)."""
    return ROUTING_UB // (4 * 2 * 4) // SORT32 * SORT32


def routing_fits(total: int, cols: int, experts: int) -> bool:
    """IsFullLoad for quantMode 1 (moe_init_routing_quant_v2_tiling.h 103-124)."""
    if total > sort_loop_max() or cols > MAX_COLS_ONE_LOOP_QUANT:
        return False
    space = (_block(total) * 4 * ONE_CORE_SORT_BUFFER + _block(total) * 4 * 3
             + _block(experts * 4))
    return ROUTING_UB - space - 64 - _block(cols) * FULLLOAD_COLS_BUFFER > 0


def needed_buffsize_mb(bs: int, h: int, k: int) -> int:
    """The window check: M * topK * K * 3 + 10 MB <= HCCL_BUFFSIZE (tiling.cpp 250-258)."""
    return ceil_div(bs * k * h * 3 + 10 * MiB, MiB)


@dataclass(frozen=True)
class Segment:
    """The rank's symmetric segment (PeermemInfo, dispatch_ffn_combine_kernel.hpp
    1051-1066): routed rows at 0, the 1 MB after a third, then combine rows (offsetD),
    the token-per-expert matrix in the last 2 MB."""

    size: int
    W: int
    L: int

    @property
    def offset_a(self) -> int:
        return 0

    @property
    def offset_scale(self) -> int:
        return align_up(self.size // 3, 512)

    @property
    def offset_d(self) -> int:
        return self.offset_scale + MiB

    @property
    def offset_counts(self) -> int:
        return self.size - 2 * MiB

    @property
    def count_row(self) -> int:
        """int32 per tokenPerExpert row (Layout3D's stride)."""
        return align_up(self.W * self.L, COUNT_ALIGN)

    def count_at(self, src: int, dst: int, g: int) -> int:
        """Byte offset of tokenPerExpert(src, dst, g)."""
        return self.offset_counts + 4 * (src * self.count_row + dst * self.L + g)

    def regions(self) -> dict[str, tuple[int, int]]:
        return {"routed_rows": (self.offset_a, self.offset_scale),
                "scale_area": (self.offset_scale, self.offset_d),
                "combine_rows": (self.offset_d, self.offset_counts),
                "token_per_expert": (self.offset_counts, self.size - MiB),
                "sync_states": (self.size - MiB, self.size)}


@dataclass(frozen=True)
class DfcTiling:
    shape: MoeShape
    N: int  # w1's columns, 2I
    buffsize_mb: int
    aic: int  # AIC cores = blocks of the MIX launch
    timing_only: bool

    W, L, H, BS, K = (property(lambda s, n=n: getattr(s.shape, n))
                      for n in ("W", "L", "H", "BS", "K"))

    @property
    def world(self) -> int:
        return self.shape.W

    @property
    def routes(self) -> int:
        return self.BS * self.K

    @property
    def max_output(self) -> int:
        return self.routes * self.W

    @property
    def aiv(self) -> int:
        return 2 * self.aic

    @property
    def segment(self) -> Segment:
        return Segment(self.buffsize_mb * MiB, self.W, self.L)

    @property
    def row_bytes(self) -> int:
        return self.H + ALIGN_512

    @property
    def gather_rows(self) -> int:
        """perCoreRows of the routing gather (Tiling4GatherDynamicQuant)."""
        return ceil_div(self.routes, ROUTING_AIV)

    @property
    def gather_cores(self) -> int:
        return ceil_div(self.routes, self.gather_rows)

    @property
    def full_load(self) -> bool:
        """Tiling key 21000 (the full-load kernel) rather than 11000 (one-core sort)."""
        return routing_fits(self.routes, self.H, self.W * self.L)

    @property
    def sort_num(self) -> int:
        return align_up(self.routes, SORT32)

    @property
    def epilogue_granularity(self) -> int:
        return self.L - 1

    def gmm(self, k: int, n: int) -> GmmTiling:
        """A grouped GEMM on CubeBlock's buffers: base 128 x 256 x 128, 4 L0 K slices per
        L1 stage (L1 K 512), two stages."""
        steps = L1_K // L0_K
        return GmmTiling(self.max_output, k, n, self.L, L1_M, L1_N, L0_K, steps, steps,
                         self.aic, 0)

    @property
    def gmm1(self) -> GmmTiling:
        return self.gmm(self.H, self.N)

    @property
    def gmm2(self) -> GmmTiling:
        return self.gmm(self.N // 2, self.H)

    def rows(self, rank: int) -> int:
        return self.max_output


def buffsize(shape: MoeShape, options: Mapping[str, Any]) -> int:
    """hccl_buffsize, or 0: the smallest the window check accepts."""
    return options["hccl_buffsize"] or needed_buffsize_mb(shape.BS, shape.H, shape.K)


def dfc_misfit(shape: MoeShape, options: Mapping[str, Any], hardware: Any) -> Misfit | None:
    """The host's checks and what npusim does not model, one line each (the chip is the
    family's check: form.chip_misfit)."""
    if options["weight_dtype"] != "int8":
        return Misfit("workload.weight_dtype", f"{options['weight_dtype']}: int8 weights "
                      "only (deep_ep.cpp 1278-1285 calls aclnnDispatchFFNCombine for int8 "
                      "weight1 and asserts any other dtype 'not yet supported'); "
                      "allowed: int8")
    n = options["intermediate"]
    if n % 2:
        return Misfit("workload.intermediate", f"{n}: gate and up halves of w1's N "
                      "(block_epilogue_pertoken_swiglu.hpp:155 ChunkTileLen = N / 2); "
                      "allowed: even")
    if shape.L < 2:
        return Misfit("workload.experts_per_rank", f"{shape.L}: epilogueGranularity = "
                      "expertPerRank - 1 = 0 (dispatch_ffn_combine.h:242) leaves the SwiGLU's "
                      "second phase out (dispatch_ffn_combine_kernel.hpp:866) and the first "
                      "has no rows, so no row would be activated; allowed: >= 2")
    if shape.S or shape.S_r:
        return Misfit("workload.shared_experts", "DispatchFFNCombine has no shared experts "
                      "(expertNum = expertPerRank * worldSize, tiling.cpp:223); allowed: 0")
    mb = buffsize(shape, options)
    need = needed_buffsize_mb(shape.BS, shape.H, shape.K)
    if mb < need:
        return Misfit("workload.hccl_buffsize", f"{mb} MB: M * topK * K * 3 + 10 MB = {need} "
                      f"MB must fit HCCL_BUFFSIZE ({SRC}:250-258); allowed: >= {need}")
    total = shape.BS * shape.K
    if total > sort_loop_max():
        return Misfit("workload.bs", f"{shape.BS} tokens x top-{shape.K}: BS * K > "
                      "sortLoopMaxElement takes moe_init_routing's multi-core sort (tiling "
                      "key 11010, moe_init_routing_quant_v2_tiling.h:153-154), not "
                      f"modelled; allowed: BS * K <= {sort_loop_max()}")
    return None


def dfc_tiling_misfit(t: DfcTiling, hardware: Any) -> Misfit | None:
    """What needs the tiling: the window the preset maps, the GEMM's cores."""
    if t.segment.size > int(hardware.window.bytes):
        return Misfit("hardware.window.bytes", f"HCCL_BUFFSIZE {t.buffsize_mb} MB is more "
                      f"than the preset's window of {int(hardware.window.bytes)} B")
    rows = t.routes * (t.row_bytes)
    if rows > t.segment.offset_scale:
        return Misfit("workload.hccl_buffsize", f"the routed rows ({rows} B) overrun the "
                      "segment's first third (PeermemInfo offsetA, "
                      "dispatch_ffn_combine_kernel.hpp:1063)")
    if t.segment.offset_d + t.routes * t.H * 2 > t.segment.offset_counts:
        return Misfit("workload.hccl_buffsize", "the combine rows overrun the segment "
                      "before its last 2 MB (PeermemInfo offsetD)")
    if t.W > t.aiv:
        return Misfit("workload.ep_world_size", f"{t.W} ranks: one AIV pulls from each "
                      f"source rank (DispatchAndCombine's dstEpIdx = coreIdx loop), {t.aiv} "
                      "AIVs")
    return None
