"""The pyPTO subgraphs' shapes and their windows.

The article's shmem tensors, per rank (the first axis of each is the rank; a rank's window
holds its slice), on HCCL windows (framework/src/machine/runtime/distributed/
distributed_context.cpp: windowsIn data, windowsExp status; npusim places both in the
rank's one symmetric window):

    shmemData    [L*W, BS, H] bf16      slot (le*W + src, tokenOffset)
    shmemInfo    [L*W, BS, 8] int32     its (rank, row, col) in the first three words
    shmemCount   [L*W + 1, 8] int32     entry le*W + src + 1: the count (entry 0 stays 0)
    shmemSignal  [8] int32              atomic-add target of send_signal
    combine data [BS*K, H] bf16         row K*token + k
    combine sig  [BS, 8] int32          per token, atomic-added once per returned row

infoSize, countSize and signalCol are not in the article: one 32 B block each (assumed).
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.kernels.common.article import ArticleTiling
from npusim.kernels.common.heap import Heap
from npusim.kernels.quant import token_dtype
from npusim.units import align_up
from npusim.workload.shape import MoeShape

BF16 = token_dtype("bfloat16")
BLOCK = 32  # one 32 B block: an info row, a count entry, a signal
INFO = 3
# runtime_options.stitch_function_max_num: default and range (hicann/pypto@883e7dfb0
# framework/src/interface/configs/tile_fwk_config.json, tile_fwk_config_schema.json)
STITCH_DEFAULT, STITCH_MAX = 128, 1024


@dataclass(frozen=True)
class PyptoTiling(ArticleTiling):
    shape: MoeShape
    block_dim: int  # MIX blocks (1 AIC + 2 AIV)
    timing_only: bool = False
    stitch: int = STITCH_DEFAULT  # stitch_function_max_num: root functions per device task

    @property
    def k_tile(self) -> int:
        """kTileShape = AlignUp(topK, 16)."""
        return align_up(self.K, 16)

    @property
    def n_tile(self) -> int:
        """nTileShape = l0bSize (65536) / sizeof(fp32) / kTileShape."""
        return 65536 // 4 // self.k_tile

    @property
    def window(self) -> PyptoWindow:
        return PyptoWindow(self)


class PyptoWindow(Heap):
    """The six tensors in the table's order, nothing between them."""

    def __init__(self, t: PyptoTiling) -> None:
        s = t.shape
        self.t = t
        super().__init__((("shmemData", t.E * s.BS * s.token_bytes),
                          ("shmemInfo", t.E * s.BS * BLOCK), ("shmemCount", (t.E + 1) * BLOCK),
                          ("shmemSignal", BLOCK),
                          ("combineData", s.BS * s.K * s.token_bytes),
                          ("combineSignal", s.BS * BLOCK)))
        (self.data, self.info, self.count, self.signal, self.combine_data,
         self.combine_signal) = self.start.values()

    def data_at(self, slot: int, offset: int) -> int:
        return self.data + (slot * self.t.shape.BS + offset) * self.t.shape.token_bytes

    def info_at(self, slot: int, offset: int) -> int:
        return self.info + (slot * self.t.shape.BS + offset) * BLOCK

    def count_at(self, entry: int) -> int:
        return self.count + entry * BLOCK

    def combine_row(self, row: int) -> int:
        return self.combine_data + row * self.t.shape.token_bytes

    def combine_sig(self, token: int) -> int:
        return self.combine_signal + token * BLOCK
