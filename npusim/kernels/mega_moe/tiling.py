"""MegaMoE's host tiling and memory layout (shmem_mega_moe_types.h, memory_layout.h).

Symmetric memory (a rank's window), every region 512 B aligned:
  [0, 60 KiB) control: rank-barrier slots at rank * 64 B, generation counters at
              48 KiB + core * 64 B (SynchronizeRanks);
  inbound_mask: L * W slots of Align32(padR / 8) mask bytes + a 32 B count,
              padR = Align256B(BS * K * 4) / 4 routes (BuildSendMasks writes them);
  quantized_tokens: BS rows of Align32(Align256(H) + ceil(H / 32)) bytes (FP8 data,
              then E8M0 scales), pulled by the receivers;
  combined_tokens: BS * K rows of H bf16 (the experts' outputs, written back 512 B at
              a time, summed by CombineRoutedTokens).
Workspace (GM scratch of the rank): received rows and scales, activations and scales,
per-expert counts per AIC, routing metadata (32 B per row: source rank, token, k), the
activation-ready and input-ready counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.common.mix import MixLaunch
from npusim.kernels.shape import OnShape
from npusim.units import KiB, align512, align_up, ceil_div
from npusim.workload.shape import MoeShape

CONTROL_BYTES = 60 * KiB
GENERATION_BASE = 48 * KiB
SLOT = 64  # bytes per barrier slot and per generation counter
WAVE = 256  # rows per dispatch wave (DISPATCH_WAVE_TILE_M = L1_TILE_M_256)
TILE_M1, TILE_N, TILE_K, L0_K = 256, 256, 256, 128  # Catlass L1 / L0 tile shapes
TILE_M2 = 128  # GEMM2's M tile (outputs in UB)
RING = 6  # DISPATCH_BUFFER_NUM: the pull ring
RING_BYTES = 8 * KiB  # TOKEN_SCALE_SIZE: one quantised row must fit
META = 32  # bytes of one routing-metadata record (INT32_PER_256B int32 over 32 B)
COMBINE_STORE = 512  # bytes of one write-back store: 256 bf16 columns
SWIZZLE = 3  # GemmIdentityBlockSwizzle<3, 1>


@dataclass(frozen=True)
class MegaTiling(MixLaunch, OnShape):
    shape: MoeShape
    F: int  # ffn_dim (gate + up)
    mode: str  # e4m3 | e5m2
    max_recv: int  # max_received_tokens (0 in the scenario: the auto capacity)
    harness: bool
    block_dim: int  # cube blocks launched (1 AIC : 2 AIV each)
    timing_only: bool = False

    # ---- sizes
    @property
    def F2(self) -> int:
        return self.F // 2

    @property
    def routes(self) -> int:
        return self.BS * self.K

    @property
    def pad_routes(self) -> int:
        return align_up(self.routes * 4, 256) // 4

    @property
    def mask_bytes(self) -> int:
        return align_up(self.pad_routes // 8, 32)

    @property
    def mask_slot(self) -> int:
        return self.mask_bytes + 32

    @property
    def scale_count(self) -> int:
        return ceil_div(self.H, 32)

    @property
    def data_bytes(self) -> int:
        """Align256(H): the FP8 part of a quantised row."""
        return align_up(self.H, 256)

    @property
    def row_bytes(self) -> int:
        return align_up(self.data_bytes + self.scale_count, 32)

    @property
    def cube_blocks_per_rank(self) -> int:
        return max(1, self.block_dim // self.W)

    @property
    def waves(self) -> int:
        return ceil_div(self.max_recv, WAVE)

    @property
    def wave_slots(self) -> int:
        return align_up(self.waves, 16)

    def gemm1_tiles(self, m: int) -> int:
        return ceil_div(m, TILE_M1) * ceil_div(self.F2, TILE_N)

    def gemm2_tiles(self, m: int) -> int:
        return ceil_div(m, TILE_M2) * ceil_div(self.H, TILE_N)

    # ---- symmetric memory
    @property
    def inbound_mask(self) -> int:
        return CONTROL_BYTES

    @property
    def quantized_tokens(self) -> int:
        return self.inbound_mask + align512(self.L * self.W * self.mask_slot)

    @property
    def combined_tokens(self) -> int:
        return self.quantized_tokens + align512(self.BS * self.row_bytes)

    @property
    def window_bytes(self) -> int:
        return self.combined_tokens + align512(self.BS * self.K * self.H * 2)

    def mask_at(self, le: int, src: int) -> int:
        return self.inbound_mask + (le * self.W + src) * self.mask_slot

    def regions(self) -> dict[str, tuple[int, int]]:
        return {"rank_barrier": (0, GENERATION_BASE),
                "generations": (GENERATION_BASE, CONTROL_BYTES),
                "inbound_mask": (self.inbound_mask, self.quantized_tokens),
                "quantized_tokens": (self.quantized_tokens, self.combined_tokens),
                "combined_tokens": (self.combined_tokens, self.window_bytes)}


def auto_capacity(shape: MoeShape) -> int:
    """max_received_tokens 0: BS * W * min(K, L) (the harness's, and its lower bound)."""
    return shape.BS * shape.W * min(shape.K, shape.L)


def swizzle(index: int, m_loops: int, n_loops: int, offset: int = SWIZZLE) -> tuple[int, int]:
    """Catlass GemmIdentityBlockSwizzle<offset, 1> (Nz): the (m, n) tile of task `index`:
    bands of `offset` N tiles, walked M-major, every other band from the bottom."""
    bands = ceil_div(n_loops, offset)
    band, inside = divmod(index, offset * m_loops)
    cols = offset if band < bands - 1 else n_loops - offset * band
    m, n = inside // cols, band * offset + inside % cols
    if band % 2:
        m = m_loops - m - 1
    return m, n
