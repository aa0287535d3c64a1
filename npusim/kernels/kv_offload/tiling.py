"""The operator's shapes (custom-npu_gather_selection_kv_cache.md) for the decode case
DeepSeek-V3.2 runs: H = 1, selection_topk_block_size = 1 (one token per selected
segment), so a segment id is a token index and a slot one row; S = 1 + next_n queries per
sequence (MTP), each with its own status, selection pool and topk (the model's TND call:
topk [B * S, 1, TOPK], status and selection block table [B * S, ...]).

DeepSeek-V3.2's MLA cache (configuration_deepseek.py: kv_lora 512, rope 64): bf16 rows of
512 x 2 = 1024 B (kv) and 64 x 2 = 128 B (rope); the int8 "c8" row is 656 B (512 int8 +
64 bf16 rope as bytes + 4 fp32 scales) with an empty rope tensor.

The core split is the tiling's DoOpTiling (gather_selection_kv_cache_tiling.cpp): the
B * S query rows in contiguous runs, factor = ceil(rows / ceil(rows / ceil(rows /
cores))) rows on each of the used cores, the last core the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.units import align_up, ceil_div

KV_BF16, ROPE_BF16, KV_C8 = 1024, 128, 656
# the Lightning Indexer's key cache per token and layer, on the device (modeling_deepseek.py
# cache entries: indexer_key_cache of index_head_dim 128 in the nope dtype, and with the
# int8 cache an fp16 indexer_key_scale_cache of one value)
INDEXER_KEY_BF16, INDEXER_KEY_C8 = 128 * 2, 128 + 2
UB_BLOCK = 32  # the tiling's ubBlockSize_
SORT_ALIGN = 32  # ONE_REPEAT_SORT_NUM: the sorts work on multiples of 32 ids
TOPK_NUMS = 8  # the kernel's scratch of 8 x topk ids (sorted lists and their indices)
I32 = 4


def core_split(rows: int, cores: int) -> tuple[int, int, int]:
    """DoOpTiling's (usedCoreNum, mainCoreBsLoopNum, tailCoreBsLoopNum) for `rows` query
    rows on `cores` AIV cores."""
    if rows <= 0:
        return 0, 0, 0
    factor = ceil_div(rows, cores)
    used = ceil_div(rows, factor)
    factor = ceil_div(rows, used)
    return used, factor, rows - (used - 1) * factor


@dataclass(frozen=True)
class KvTiling:
    batch: int  # B: sequences on this card
    seq_len: int  # full_kv_actual_seq of every sequence
    topk: int  # TOPK
    block: int  # BLOCK_SIZE tokens of a cache block (both caches)
    c8: bool
    location: str  # hbm | host: where full_kv_cache / full_k_rope live
    reuse: float  # share of this step's topk already in the selection cache
    cache_blocks: int  # F_BLOCK_NUM (0: exactly batch * f_max)
    layers: int  # calls per decode step (one per layer), for the per-step figures
    aiv_cores: int  # the die's AIV cores (GetCoreNumAiv)
    launch_ns: float = 0.0  # the plain task launch (kernel.task_launch_ns)
    world: int = 1
    queries: int = 1  # S: queries per sequence per step (1 + next_n)
    memory: str = "shmem_host"  # shmem_host | swapped: how the host cache was allocated
    page_bytes: int = 0  # the host cache's page (its allocator's; 0: no host memory)

    @property
    def huge_pages(self) -> bool:
        """SHMEM's HOST_SIDE heap maps huge pages; torch_npu's swapped memory is pinned in
        the OS's base pages (NPUSwappedMemoryAllocator: aclrtMallocHost, aclrtHostRegister)."""
        return self.memory == "shmem_host"

    @property
    def kv_bytes(self) -> int:
        return KV_C8 if self.c8 else KV_BF16

    @property
    def rope_bytes(self) -> int:
        return 0 if self.c8 else ROPE_BF16

    @property
    def indexer_key_bytes(self) -> int:
        return INDEXER_KEY_C8 if self.c8 else INDEXER_KEY_BF16

    @property
    def row_bytes(self) -> int:
        return self.kv_bytes + self.rope_bytes

    @property
    def rows(self) -> int:
        """B * S query rows (the tiling's batchSize_ after GetSeqLenIn)."""
        return self.batch * self.queries

    @property
    def f_max(self) -> int:
        """F_MAX_BLOCK_NUM: blocks of one sequence's full cache."""
        return ceil_div(self.seq_len, self.block)

    @property
    def f_blocks(self) -> int:
        return self.cache_blocks or self.batch * self.f_max

    @property
    def s_max(self) -> int:
        """S_MAX_BLOCK_NUM: blocks of one query row's selection cache (TOPK rows)."""
        return ceil_div(self.topk, self.block)

    @property
    def s_blocks(self) -> int:
        return self.rows * self.s_max

    @property
    def split(self) -> tuple[int, int, int]:
        return core_split(self.rows, self.aiv_cores)

    @property
    def cores(self) -> int:
        """The cores launched (SetBlockDim(usedCoreNum))."""
        return max(1, self.split[0])

    def rows_of(self, core: int) -> range:
        """The query rows core `core` takes: a contiguous run of mainCoreBsLoopNum rows
        (the last used core tailCoreBsLoopNum)."""
        used, main, tail = self.split
        if core >= used:
            return range(0)
        return range(core * main, core * main + (tail if core == used - 1 else main))

    def visible(self, q: int) -> int:
        """Tokens query q of a sequence sees: the sequence's length less the queries after
        it (curFullKvSeqModify = kv - (S - 1 - q))."""
        return self.seq_len - (self.queries - 1 - q)

    def ub_bytes(self) -> int:
        """The UB the vec kernel's Init reserves: the topk queue, the work buffer (the
        selection block table, the valid counts, the status, 8 x topk of sort scratch)
        and two kv (+ rope) row buffers, sized for S rows as Init sizes them."""
        sh = self.queries
        sort_align = align_up(self.topk, SORT_ALIGN)
        one_align = max(sort_align, align_up(self.topk + 1, UB_BLOCK // I32))
        work = (align_up(sh * self.s_max * I32, UB_BLOCK) + align_up(sh * I32, UB_BLOCK)
                + sh * one_align * I32 + sort_align * I32 * TOPK_NUMS)
        rows = 2 * (align_up(self.kv_bytes, UB_BLOCK) + align_up(self.rope_bytes, UB_BLOCK))
        return sh * sort_align * I32 + work + rows
