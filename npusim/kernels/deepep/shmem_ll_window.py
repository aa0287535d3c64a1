"""Where DeepEP-Ascend's SHMEM low-latency pair (the `shmem_ver` branch's
ShmemMoeDistributeDispatchV2 / CombineV2) keeps its state, flags and data, and the window
limit its tilings check.

Both kernels are the branch's HCCL fork of mc2's V2 pair with every window address taken
from the 100 MiB metadata block deep_ep.cpp allocates first (``shmem_calloc``, heap offset
0, its address the ``shmemptr`` attribute) instead of the peers' HCCL windows. The rank
argument of GetWindAddrByRankId / GetWindStateAddrByRankId is ignored: every address is the
local symmetric one, and the put call (``shmem_put_*_mem_nbi(dst, src, len, pe)``) takes the
rank. Offsets from the block's start (shmem_moe_distribute_dispatch_v2.h,
shmem_moe_distribute_combine_v2.h, shmem_moe_distribute_v2_base.h), ds the data state:

    core * 512                          the per-core state word of **both** kernels
                                        (ShmemInitWinState flips word 0)
    950 KiB + ds * 500 KiB              dispatch status, 32 B per (local expert * R + source)
    975 + 64 KiB + ds * 500 KiB         combine flags, 32 B per (token * (K + S) + k)
    950 KiB + ds * 500 KiB + 1 MiB      dispatch data, maxBs slots per (source * L + local)
    975 + 64 KiB + ds * 500 KiB + 1 MiB combine data, Align512(2H) per (token, k); the
      + ds * 4000 MiB / 2               second half 2000 MiB on (totalWinSize / 2)

The dispatch's winDataSizeOffset_ (the combine area first, then the dispatch's, in HCCL's
halves) is still computed and no longer used. Past 100 MiB the areas lie in the rest of the
8 GiB heap, which in low-latency mode nothing else allocates (its outputs are ordinary
tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from npusim.kernels.mc2.window import Mc2Window
from npusim.units import KiB, MiB, align32, align512

DISPATCH_STATE_WIN_OFFSET = 950 * KiB  # shmem_moe_distribute_dispatch_v2.h STATE_WIN_OFFSET
COMBINE_STATE_WIN_OFFSET = 975 * KiB  # shmem_moe_distribute_combine_v2.h STATE_WIN_OFFSET
WIN_STATE_OFFSET = 500 * KiB  # the data state's status half
COMBINE_STATE_OFFSET = 64 * KiB  # the combine's status after the dispatch's
RANK_META_INFO_OFFSET = 1 * MiB  # data after the status
WIN_ADDR_ALIGN = 512  # a core's state word: metaInfo + core * 512
SHMEM_BUFF_MB = 4000  # the tilings' CheckWinSize: defaultWindowSize, "Shmem_Buff"
SHMEM_BUFF = SHMEM_BUFF_MB * MiB  # totalWinSize the host hands both kernels
MAX_OUT_DTYPE_SIZE = 2  # the check sizes every token as 2 B per element
SCALE_EXPAND_IDX_BUFFER = 44  # the check's 32 B scale + 12 B triple
SRC = "shmem_moe_distribute_dispatch_v2_tiling.cpp"


@dataclass(frozen=True)
class ShmemLLWindow(Mc2Window):
    """mc2's window with the shmem_ver addresses and SHMEM's put (the slots, their bytes
    and the kernels' steps are mc2's)."""

    bs: int = 0  # the most tokens a rank has: the combine's flags and rows (0: max_bs)

    @classmethod
    def of(cls, win: Mc2Window, bs: int = 0) -> ShmemLLWindow:
        return cls(**{f.name: getattr(win, f.name) for f in fields(win)}, bs=bs)

    @property
    def tokens(self) -> int:
        return self.bs or self.max_bs

    # ---- the metadata block
    def dispatch_state_word(self, core: int) -> int:
        return core * WIN_ADDR_ALIGN

    def combine_state_word(self, core: int) -> int:
        """The dispatch's word: the combine's 25 KiB of its own (STATE_WIN_OFFSET's comment)
        is never added."""
        return core * WIN_ADDR_ALIGN

    def dispatch_status_base(self, state: int) -> int:
        """GetWindStateAddrByRankId of the dispatch."""
        return DISPATCH_STATE_WIN_OFFSET + state * WIN_STATE_OFFSET

    def combine_status_base(self, state: int) -> int:
        """GetWinStateAddrByRankId of the combine: STATE_WIN_OFFSET + winStatusOffset_."""
        return COMBINE_STATE_WIN_OFFSET + COMBINE_STATE_OFFSET + state * WIN_STATE_OFFSET

    def dispatch_status(self, state: int, entry: int) -> int:
        return self.dispatch_status_base(state) + entry * 32

    def combine_flag(self, state: int, token: int, k: int) -> int:
        return self.combine_status_base(state) + (token * self.slots_per_token + k) * 32

    # ---- data
    def dispatch_block(self, state: int, block: int) -> int:
        """GetWindAddrByRankId + expertPerSizeOnWin_ * block (block = source * L + local)."""
        return self.dispatch_status_base(state) + RANK_META_INFO_OFFSET + block * self.block_bytes

    def combine_data(self, state: int) -> int:
        """GetWinAddrByRankId of the combine: + RANK_META_INFO_OFFSET + winDataSizeOffset_
        (ds * totalWinSize / 2)."""
        return (self.combine_status_base(state) + RANK_META_INFO_OFFSET
                + state * (SHMEM_BUFF // 2))

    def combine_slot_offset(self, state: int, token: int, k: int) -> int:
        return self.combine_data(state) + (token * self.slots_per_token + k) * self.combine_step

    def put(self, ctx: Any, pe: int, offset: int, buf: Any, nbytes: int, src_offset: int = 0,
            name: str = "put") -> Any:
        """shmem_put_*_mem_nbi(dst, ub, len, pe): one MTE3 DataCopyPad of len elements to
        aclshmem_ptr(dst, pe), not waited for (shmem.put_ub)."""
        return ctx.shmem.put_ub(pe, offset, buf, nbytes, src_offset, name=name)

    def regions(self, state: int = 0) -> dict[str, tuple[int, int]]:
        """The areas of a dispatch at data state `state` and the combine after it (at the
        flipped state), as DeepEP runs them: dispatch, combine, dispatch, ... from the
        calloc'd 0, so every dispatch at 0 and every combine at 1."""
        d, c = state, 1 - state
        ds, cs = self.dispatch_status_base(d), self.combine_status_base(c)
        disp = self.dispatch_block(d, 0)
        comb = self.combine_data(c)
        return {
            "state_words": (0, self.dispatch_state_word(self.cores)),
            "dispatch_status": (ds, ds + 32 * self.W * self.L),
            "combine_flags": (cs, cs + 32 * self.tokens * self.slots_per_token),
            "dispatch_data": (disp, disp + self.dispatch_area),
            "combine_data": (comb, comb + self.tokens * self.slots_per_token * self.combine_step),
        }

    @property
    def end(self) -> int:
        """The heap bytes the pair reaches."""
        return max(b for _, b in self.regions().values())

    def overlap(self) -> tuple[str, str] | None:
        """Two areas of one dispatch / combine pair that share bytes, if any."""
        zones = list(self.regions().items())
        for i, (n0, (a0, b0)) in enumerate(zones):
            for n1, (a1, b1) in zones[i + 1:]:
                if a0 < b1 and a1 < b0:
                    return n0, n1
        return None


def shmem_buff_need(max_bs: int, h: int, W: int, L: int, K: int, S: int) -> int:
    """CheckWinSize's actualSize: ((maxBs Align512(Align32(2H) + 44) W L) + (maxBs
    Align512(2H) (K + S))) * 2 bytes."""
    dispatch = align512(align32(h * MAX_OUT_DTYPE_SIZE) + SCALE_EXPAND_IDX_BUFFER)
    combine = align512(h * MAX_OUT_DTYPE_SIZE)
    return (max_bs * dispatch * W * L + max_bs * combine * (K + S)) * 2
