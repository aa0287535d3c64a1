"""FusedDeepMoe A5's host side: the tiling's sizes (op_host/fused_deep_moe_a5/
fused_deep_moe_tiling.cpp, op_kernel/fused_deep_moe_a5/fused_deep_moe_a5_tiling.h), the
host checks that refuse a shape, and the grouped GEMMs' tiles. What both builds' kernels
size alike (capacity, n2, the window slot) comes from fused_deep_moe_base.sizes, the
block walk from fused_deep_moe_base.swizzle.

Sources are sgl-kernel-npu branch main (f425bdf1, 2026-08-21); branch fused_moe_a5
(8c47ef5d, 2026-07-22) is the first drop of the same kernel, without the profiler's stage
records that name this model's phases. Paths below: TILING = op_host/fused_deep_moe_a5/
fused_deep_moe_tiling.cpp, G1 = .../gemm/kernel/dispatch_mx_gmm1_swiglu.h, G2 =
.../gemm/kernel/mx_gmm2_cast_combine.h.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npusim.kernels.common.mix import MixLaunch
from npusim.kernels.family import Misfit
from npusim.kernels.moe_layer.fused_deep_moe_base.sizes import FusedSizes
from npusim.kernels.moe_layer.fused_deep_moe_base.swizzle import BlockWalk
from npusim.kernels.moe_layer.fused_deep_moe_base.window import TOKEN_EXTRA_SPACE
from npusim.kernels.shape import OnShape
from npusim.units import MiB, ceil_div
from npusim.workload.shape import MoeShape

TILING = "fused_deep_moe_tiling.cpp"
# fused_deep_moe_a5_tiling.h 63-77: both GEMMs' L1 tile 256 x 256 x 256, L0 K 128,
# epilogue tile 64 x 256, GemmIdentityBlockSwizzle<3, 0>
TILE_M, TILE_N, TILE_K, L0_K, EPI_M = 256, 256, 256, 128, 64
MX_BLOCK = 32  # MX_SCALE_GROUP_NUM: one E8M0 scale per 32 elements of K
# host limits, TILING 55-66
MAX_BS, MAX_EXPERTS, MAX_TOP_K = 256, 512, 12
MIN_H, MAX_H = 512, 7168
MIN_N1, MAX_N1, N1_ALIGN = 1024, 6144, 1024
MODES = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}  # weight dtype -> MX element format
FP4 = ("fp4_e2m1", "fp4_e1m2")
WEIGHT_DTYPES = (*MODES, *FP4)


@dataclass(frozen=True)
class A5Tiling(MixLaunch, OnShape, FusedSizes):
    """One launch's sizes: `n1` is gmm1HLen (GMM1's columns, 2I), `block_dim` the AIC
    count (SetBlockDim(aicNum), TILING 773), `hccl_bytes` the window HCCL_BUFFSIZE gives;
    capacity (maxTokenNum), n2 and the window slot as both builds size them (FusedSizes)."""

    shape: MoeShape
    n1: int
    mode: str  # e4m3 | e5m2
    block_dim: int
    hccl_bytes: int
    timing_only: bool = False

    # ---- the kernel's sizes (FusedDeepMoe::Init, G1 AivInitParams)
    @property
    def global_bs(self) -> int:
        return self.shape.global_bs or self.BS * self.W

    @property
    def max_bs(self) -> int:
        return self.global_bs // self.W

    @property
    def routes(self) -> int:
        return self.BS * self.K

    @property
    def senders(self) -> int:
        """expertCntUp: the (expert, source rank) status entries a rank receives."""
        return self.W * self.L

    @property
    def x1_scales(self) -> int:
        """x1MxScaleNum: E8M0 scales of a dispatched token, CEIL(H, 32)."""
        return ceil_div(self.H, MX_BLOCK)

    @property
    def x2_scales(self) -> int:
        """mxScaleNumPerToken of the requant: CeilDiv(CeilDiv(N1/2, 32), 2) * 2."""
        return ceil_div(ceil_div(self.n2, MX_BLOCK), 2) * 2

    @property
    def scale_flag_bytes(self) -> int:
        """scaleFlagSize: the scales and the int32 flag, rounded up to 512 B."""
        return ceil_div(self.x1_scales + 4, TOKEN_EXTRA_SPACE) * TOKEN_EXTRA_SPACE

    @property
    def record(self) -> int:
        """hCommuSize: one dispatched token in the window (FP8 codes, scales, flag)."""
        return self.H + self.scale_flag_bytes

    @property
    def hccl_demand(self) -> int:
        """CheckHcclBufferSize: E_loc * globalBs * H * 2 B * 2 halves (TILING 564)."""
        return self.L * self.global_bs * self.H * 2 * 2

    # ---- the GEMMs' blocks
    def gemm1_blocks(self, m: int) -> int:
        return ceil_div(m, TILE_M) * ceil_div(self.n1, TILE_N)

    def gemm2_blocks(self, m: int) -> int:
        return ceil_div(m, TILE_M) * ceil_div(self.H, TILE_N)


def block_walk(n: int, cores: int, core: int) -> BlockWalk:
    """The blocks one core runs over a GEMM of n columns, group after group, on both
    GEMMs' 256 x 256 tiles (G1 400-476 on the AIC, 1418-1470 on the AIV; G2 177-263,
    376-420): the walk both builds share, fused_deep_moe_base.swizzle."""
    return BlockWalk(n, TILE_M, TILE_N, cores, core)


def misfit(shape: MoeShape, options: Mapping[str, Any]) -> Misfit | None:
    """The host's refusals (TILING CheckData 442-490, GetAttrAndSetTilingData 505-523),
    then what this model leaves out."""
    n1, wd = options["intermediate"], options["weight_dtype"]
    checks = (
        ("workload.bs", shape.BS > MAX_BS,
         f"{shape.BS}: batchSize(bs) must <= {MAX_BS} ({TILING}:448); allowed: 1..{MAX_BS}"),
        ("workload.h", not MIN_H <= shape.H <= MAX_H,
         f"{shape.H}: tokenLength(h) only [{MIN_H}, {MAX_H}] ({TILING}:452)"),
        ("workload.intermediate", not MIN_N1 <= n1 <= MAX_N1,
         f"{n1}: gmm1 hidden size (2I) only [{MIN_N1}, {MAX_N1}] ({TILING}:457)"),
        ("workload.intermediate", n1 % N1_ALIGN != 0,
         f"{n1}: gmm1 hidden size must be divisible by {N1_ALIGN} ({TILING}:461)"),
        ("workload.h", wd in FP4 and shape.H % 2 != 0,
         f"{shape.H}: tokenLength(h) must be even for MX FP4 weights ({TILING}:465)"),
        ("workload.k", shape.K > MAX_TOP_K,
         f"{shape.K}: topK(k) must <= {MAX_TOP_K} ({TILING}:473)"),
        ("workload.k", shape.K > shape.E,
         f"{shape.K}: topK(k) must <= moeExpertNum {shape.E} ({TILING}:475)"),
        ("workload.experts_per_rank", shape.E > MAX_EXPERTS,
         f"{shape.E} experts: moeExpertNum must <= {MAX_EXPERTS} ({TILING}:516)"),
        ("workload.global_bs", shape.global_bs % shape.W != 0,
         f"{shape.global_bs}: globalBatchSize must be divisible by epRankSize "
         f"({TILING}:485)"),
    )
    for key, bad, why in checks:
        if bad:
            return Misfit(key, why)
    if wd not in WEIGHT_DTYPES:
        return Misfit("workload.weight_dtype", f"{wd}: the A5 kernel's weights are MX FP8 "
                      "or FP4 (op_host/fused_deep_moe_a5/fused_deep_moe.cpp 16-19); allowed: "
                      f"{', '.join(MODES)}")
    if wd in FP4:
        return Misfit("workload.weight_dtype", f"{wd}: MX FP4 weights (GMM on packed FP4, "
                      "ComputeFp4Data requant) are not modelled; allowed: "
                      f"{', '.join(MODES)}")
    if shape.S or shape.S_r:
        return Misfit("workload.shared_experts", "shared experts (EXEC_FLAG_SHARED_EXPERT) "
                      "are not modelled; the A5 test does not wire them; allowed: 0")
    if shape.H % (2 * MX_BLOCK):
        return Misfit("workload.h", f"{shape.H}: the model holds a token's E8M0 scales as "
                      "H / 32 bytes, the AIC reads them per CeilDiv(H, 64) * 2 "
                      f"(G1 402-403); allowed: multiples of {2 * MX_BLOCK}")
    return None


def hccl_misfit(t: A5Tiling) -> Misfit | None:
    if t.hccl_demand > t.hccl_bytes:
        return Misfit("workload.hccl_buffsize", f"HCCL_BUFFSIZE is too small: E_loc * "
                      f"globalBs * H * 2 B * 2 = {ceil_div(t.hccl_demand, MiB)} MB, more "
                      f"than {t.hccl_bytes // MiB} MB ({TILING}:564-572)")
    return None
