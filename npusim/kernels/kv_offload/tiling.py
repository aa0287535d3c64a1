"""The operator's shapes (custom-npu_gather_selection_kv_cache.md) for the decode case
DeepSeek-V3.2 runs: S = 1 query per sequence, H = 1, selection_topk_block_size = 1 (one
token per selected segment), so a segment id is a token index and a slot one row.

DeepSeek-V3.2's MLA cache (configuration_deepseek.py: kv_lora 512, rope 64): bf16 rows of
512 x 2 = 1024 B (kv) and 64 x 2 = 128 B (rope); the int8 "c8" row is 656 B (512 int8 +
64 bf16 rope as bytes + 4 fp32 scales) with an empty rope tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_BF16, ROPE_BF16, KV_C8 = 1024, 128, 656
INDEXER_KEY = 256  # the Lightning Indexer's key per token and layer (128 bf16), on device


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
    cores: int
    launch_ns: float = 0.0  # the plain task launch (kernel.task_launch_ns)
    world: int = 1

    @property
    def kv_bytes(self) -> int:
        return KV_C8 if self.c8 else KV_BF16

    @property
    def rope_bytes(self) -> int:
        return 0 if self.c8 else ROPE_BF16

    @property
    def row_bytes(self) -> int:
        return self.kv_bytes + self.rope_bytes

    @property
    def f_max(self) -> int:
        """F_MAX_BLOCK_NUM: blocks of one sequence's full cache."""
        return ceil_div(self.seq_len, self.block)

    @property
    def f_blocks(self) -> int:
        return self.cache_blocks or self.batch * self.f_max

    @property
    def s_max(self) -> int:
        """S_MAX_BLOCK_NUM: blocks of one sequence's selection cache (TOPK rows)."""
        return ceil_div(self.topk, self.block)

    @property
    def s_blocks(self) -> int:
        return self.batch * self.s_max

    def batches_of(self, core: int) -> range:
        return range(core, self.batch, self.cores)
