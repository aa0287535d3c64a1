"""The layered dispatch's constants (moe_distribute_dispatch_v2_layered_custom.h) and
where it and the layered combine keep things in a rank's window: one layout for both."""

from __future__ import annotations

from dataclasses import dataclass

from npusim.units import align_up
from npusim.workload.shape import MoeShape

MiB = 1 << 20

# the kernel's constants (moe_distribute_dispatch_v2_layered_custom.h)
STATE_OFFSET = 512
STATUS_SIZE_LAYERED = MiB
RDMA_BUFFER_ALIGN = 4096
SERVER_RANK_SIZE = 8
UB_32B_ALIGN = 32
EXP_TOKEN_COUNT_FLAG_CNT = 8
IPC_DATA_OFFSET = 4 * MiB
RDMA_DATA_SIZE = 800 * MiB
IPC_FLAG_OFFSET = MiB
IPC_TOKEN_CNT_OFFSET = 2 * MiB
IPC_MAGIC_OFFSET = IPC_TOKEN_CNT_OFFSET - 128 * 32
IPC_BUFF_ALIGN = 512
MAX_BS_NUM = 512
SHOULD_SEND_FLAG_VALUE = 0x0F0F0F0F
END_OF_WRITE_FLAG_VALUE = 0xFFFFFFFF
FLAG_SIZE = 64
EXTRA_TOKEN_INFO_NUM = 4
NOTIFY_DATA_SIZE = 400 * MiB
TBUF_SIZE = 190 * 1024
TBUF_TEMP_OFFSET = 8 * 1024
KERNEL = "moe_distribute_dispatch_v2_layered_custom.h"
# the layered combine's (moe_distribute_combine_v2_layered_custom.h): IPC_REDUCE_USED_CORE_NUM,
# and FLAG_TOTAL_SIZE uint64 words of token flags per server, in bytes
COMBINE_REDUCE_CORES = 32
COMBINE_FLAGS_PER_SERVER = MAX_BS_NUM * SERVER_RANK_SIZE * 4 * 8

RUNS = {"dispatch": ("low_latency_dispatch_layered",),
        "dispatch_combine": ("low_latency_dispatch_layered", "low_latency_combine_layered"),
        "combine": ("low_latency_combine_layered",)}


def win_size_min(shape: MoeShape) -> int:
    """Init's assert: moeExpertNum * BS * (H * sizeof(XType) + 4 * Align8(K) * 4) + IPC_DATA_OFFSET
    + RDMA_DATA_SIZE + NOTIFY_DATA_SIZE (the most a rank can receive, however unbalanced)."""
    align_k = align_up(shape.K, 8)
    return (shape.E * shape.BS * (shape.H * 2 + EXTRA_TOKEN_INFO_NUM * align_k * 4)
            + IPC_DATA_OFFSET + RDMA_DATA_SIZE + NOTIFY_DATA_SIZE)


@dataclass(frozen=True)
class LayeredWindow:
    """Where the kernel keeps things in a rank's window (windowsIn, HCCL_BUFFSIZE bytes)."""

    W: int
    L: int
    cores: int
    total_size: int  # winSize

    @property
    def server_num(self) -> int:
        return self.W // SERVER_RANK_SIZE

    @property
    def half_win(self) -> int:
        return RDMA_DATA_SIZE // 2

    @property
    def win_size(self) -> int:
        """WIN_SIZE: a half's token area, before its status MiB."""
        return self.half_win - STATUS_SIZE_LAYERED

    @property
    def buffer_chosen(self) -> int:
        return self.win_size + self.W * STATE_OFFSET

    @property
    def server_size_on_win(self) -> int:
        return self.win_size // self.server_num // RDMA_BUFFER_ALIGN * RDMA_BUFFER_ALIGN

    @property
    def rank_size_on_ipc(self) -> int:
        free = self.total_size - RDMA_DATA_SIZE - IPC_DATA_OFFSET - NOTIFY_DATA_SIZE
        return free // (self.L * self.W) // IPC_BUFF_ALIGN * IPC_BUFF_ALIGN

    def rdma_tokens(self, buf: int, server: int) -> int:
        return buf * self.half_win + server * self.server_size_on_win

    def rdma_status(self, buf: int, server: int) -> int:
        return buf * self.half_win + self.win_size + server * STATE_OFFSET

    def ipc(self, offset: int) -> int:
        """shareAddrs[i] + offset: the IPC area starts after the RDMA area."""
        return RDMA_DATA_SIZE + offset

    def ipc_data(self, le: int, src: int) -> int:
        return self.ipc(IPC_DATA_OFFSET) + (le * self.W + src) * self.rank_size_on_ipc

    @property
    def end(self) -> int:
        return self.ipc_data(self.L, 0)

    def regions(self, state: int = 0) -> dict[str, tuple[int, int]]:
        """The layered dispatch's and combine's areas (one layout for both kernels): per
        RDMA half its data and its status MiB (bufferChosen, the end flags, the combine's
        status and per-core toggles), then the IPC area's parts."""
        z = {}
        for b in (0, 1):
            z[f"rdma_data{b}"] = (self.rdma_tokens(b, 0), b * self.half_win + self.win_size)
            z[f"rdma_status{b}"] = (self.rdma_status(b, 0), (b + 1) * self.half_win)
        z["ipc_combine_flags"] = (self.ipc(0), self.ipc(IPC_FLAG_OFFSET))
        z["ipc_flags_magic"] = (self.ipc(IPC_FLAG_OFFSET), self.ipc(IPC_TOKEN_CNT_OFFSET))
        z["ipc_token_cnt"] = (self.ipc(IPC_TOKEN_CNT_OFFSET), self.ipc(IPC_DATA_OFFSET))
        z["ipc_data"] = (self.ipc(IPC_DATA_OFFSET),
                         max(self.end, self.total_size - NOTIFY_DATA_SIZE))
        return z
