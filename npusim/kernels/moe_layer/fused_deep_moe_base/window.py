"""The window constants and words both FusedDeepMoe builds' kernels declare alike.

The A3's GMM1 kernel (GMM1K: grouped_matmul_slice_m_per_token_dequant_swiglu_quant_
multistage_workspace.h) and the 950's (G1: fused_deep_moe_a5/.../dispatch_mx_gmm1_swiglu.h)
open with the same status-area offsets, record padding and flag words; their combines
(cam_moe_distribute_combine.h, a3/ and fused_deep_moe_a5/raw_distributed/) the same
STATE_SIZE. Where the builds lay these out differs (the A3's data area in windowsIn and
status in windowsExp, the 950's state area first, then the data), so each build keeps its
own window class; the data slot's offset within the data area is shared (`data_slot`).
"""

from __future__ import annotations

from npusim.kernels.moe_layer.fused_deep_moe_base.sizes import FusedSizes
from npusim.units import KiB, MiB

STATE_OFFSET = 512  # GMM1K:15, G1 23: bytes of one count / status entry
WIN_STATE_OFFSET = 512 * KiB  # GMM1K:16, G1 24: the second data state's status entries
STATE_WIN_OFFSET = 900 * KiB  # GMM1K:17, G1 25: the cores' data-state words
GROUP_TOKEN_NUM_OFFSET = 932 * KiB  # GMM1K:18, G1 26: the per-group V -> C lines
SOFT_SYNC_OFFSET = 964 * KiB  # GMM1K:19, G1 27: GMM1's soft-sync counters
SELF_STATE_OFFSET = 256 * KiB  # GMM1K:20, G1 29: a state's self-status, after its entries
UB_ALIGN = 32  # GMM1K:22, G1 31
TOKEN_EXTRA_SPACE = 512  # GMM1K:23, G1 32: a dispatched token's scale and flag padding
SOFT_SYNC_SPACE_SIZE = 512  # GMM1K:25, fused_deep_moe_utils.h:8: bytes per counter
OPT_RANK_OFFSET = 512  # GMM1K:35, G1 44: each owner's data shifted by rank id * this
TOKEN_FLAG_1 = 0x55555555  # GMM1K:50, G1 49: the first launch's token flag
V_TO_C_FLAG_1 = 0x03030303  # GMM1K:52, G1 51: the first launch's receive-done word
GROUP_TOKEN_COUNT = 3  # GMM1K:59, G1 58: the group line's word holding the group's rows
GROUP_INFO_SIZE = 32  # GMM1K:60, G1 59: int32 per group line
STATUS_ONE = 0x3F800000  # fp32 1.0 as the status words carry it (GMM1K:701, G1 611)
STATE_SIZE = 1 * MiB  # cam_moe_distribute_combine.h:13 (a3), :15 (fused_deep_moe_a5)


def data_slot(t: FusedSizes, half: int, owner: int, index: int) -> int:
    """Slot `index` (source rank * L + local expert) of data half `half` in rank `owner`'s
    data area (GET_WIND_ADDR_BY_RANK_ID, GMM1K:45-49; G1 GetWindAddrByRankId 298-302)."""
    return half * t.data_half_bytes + owner * OPT_RANK_OFFSET + index * t.slot_bytes
