"""The SHMEM heap of DeepEP-Ascend's `shmem_ver` normal mode, its limits, UB needs and the
SyncAll + shmem_barrier_all every one of its kernels ends a phase with.

deep_ep.cpp (DEEPEP_SHMEM_ENABLE=1) initialises SHMEM with ``local_mem_size`` 8 GiB per PE
and first takes ``shmem_ptr = shmem_calloc(100 MiB)``, the metadata block every kernel
receives as ``ext_info``; the normal kernels then work on symmetric tensors made by
``create_tensor_from_shmem`` (``shmem_malloc``, the same offset on every PE):
num_tokens_per_expert [E] (dispatch_layout's output), recv_data [R, E] (notify's),
expandx_out [N, H] and dynamic_scales_out [N] (the dispatch's). The combine reads the
recv_x it is given through ``shmem_ptr`` too, so that must be one of them.

npusim's window is one PE's heap. Offsets (each allocation 512 B aligned, an assumption:
the allocator's alignment is not in the branch, and no cost depends on an address):

    [0, 100 MiB)                metadata (the normal combine's magic at 50 KiB + core * 512)
    num_tokens_per_expert       E int32
    recv_data                   R E int32
    expand_x                    N rows of Align32(H * item) (N: the most rows a PE receives)
    dynamic_scales              N fp32 (INT8)
    combine_x                   N rows of 2H bf16: the combine's recv_x; with a BF16
                                dispatch it is expand_x itself
    sync pool                   the library's: the WORLD team's sync_array line and its
                                sync_counter (hicann/shmem keeps it past local_mem_size,
                                in ACLSHMEM_EXTRA_SIZE; npusim right after the tensors)

PEs are ``ALIGN_UP(heap, 1 GiB)`` apart in the device's address space at hicann/shmem's HEAD
(``heap_size`` + the extra, unrounded, at the version of the branch's date): 1 GiB is the
granule, not the stride, so with 8 GiB nothing a kernel writes reaches the next PE's heap
while the tensors fit ``local_mem_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npusim.kernels.deepep.tiling import DeepepTiling
from npusim.runtime.conditions import Wait
from npusim.runtime.context import KernelContext
from npusim.units import GiB, KiB, MiB, align32, align256, align_up

LOCAL_MEM_SIZE = 8 * GiB  # deep_ep.cpp internode::init
META_DATA_SIZE = 100 * MiB  # deep_ep.cpp shmem_calloc(meta_data_size)
HEAP_ALIGNMENT_SIZE = 1 * GiB  # ACLSHMEM_HEAP_ALIGNMENT_SIZE (shmem_common_types.h)
HEAP_ALLOC_ALIGN = 512  # assumed shmem_malloc alignment
NOTIFY_MAGIC_OFFSET = 50 * KiB  # shmem_moe_combine_normal.h: InitMagic's per-core u64
WIN_512_ALIGN = 512
SYNC_POOL_BYTES = 128  # sync_array and sync_counter, one 64 B line each
# the tilings' checks (op_host/shmem_moe_{dispatch,combine}_normal_tiling.cc)
MIN_EP_WORLD_SIZE, MAX_EP_WORLD_SIZE = 2, 384
MOE_EXPERT_MAX_NUM = 512
DISPATCH_STATUS_MAX_SUPPORT_NUM = 1280
K_MAX = 16
H_MIN, H_MAX = 1024, 7168
FP32_EXACT = 1 << 24  # the largest count notify's Cast + ReduceSum (fp32) sums exactly


def pe_stride(heap: int = LOCAL_MEM_SIZE) -> int:
    """p2p_device_heap_base[i] = gva + ALIGN_UP(heap_size, 1 GiB) * i (HEAD)."""
    return align_up(heap, HEAP_ALIGNMENT_SIZE)


def expand_row_bytes(t: DeepepTiling) -> int:
    """hUBAlignSize: the dispatch's row stride, Align32(H * sizeof(ExpandXOut))."""
    return align32(t.H * t.out_dtype.itemsize)


@dataclass(frozen=True)
class ShmemHeap:
    """Where the symmetric tensors of one call sit in every PE's heap (the window)."""

    t: DeepepTiling

    def _after(self, start: int, nbytes: int) -> int:
        return align_up(start + nbytes, HEAP_ALLOC_ALIGN)

    @property
    def rows(self) -> int:
        return self.t.rows_capacity

    @property
    def num_tokens_per_expert(self) -> int:
        return META_DATA_SIZE

    @property
    def recv_data(self) -> int:
        return self._after(self.num_tokens_per_expert, 4 * self.t.E)

    @property
    def expand_x(self) -> int:
        return self._after(self.recv_data, 4 * self.t.W * self.t.E)

    @property
    def dynamic_scales(self) -> int:
        return self._after(self.expand_x, self.rows * expand_row_bytes(self.t))

    @property
    def own_combine_x(self) -> bool:
        """An INT8 dispatch's rows are not the combine's bf16 recv_x: a tensor of its own."""
        return self.t.quant == "int8"

    @property
    def combine_x(self) -> int:
        if not self.own_combine_x:
            return self.expand_x
        return self._after(self.dynamic_scales, 4 * self.rows)

    @property
    def sync_pool(self) -> int:
        end = (self._after(self.combine_x, 2 * self.t.H * self.rows) if self.own_combine_x
               else self._after(self.dynamic_scales, 4 * self.rows))
        return end

    @property
    def end(self) -> int:
        return self.sync_pool + SYNC_POOL_BYTES

    def combine_magic(self, core: int) -> int:
        return NOTIFY_MAGIC_OFFSET + core * WIN_512_ALIGN

    def regions(self) -> dict[str, tuple[int, int]]:
        t = self.t
        z = {"meta_data": (0, META_DATA_SIZE),
             "num_tokens_per_expert": (self.num_tokens_per_expert,
                                       self.num_tokens_per_expert + 4 * t.E),
             "recv_data": (self.recv_data, self.recv_data + 4 * t.W * t.E),
             "expand_x": (self.expand_x, self.expand_x + self.rows * expand_row_bytes(t)),
             "dynamic_scales": (self.dynamic_scales, self.dynamic_scales + 4 * self.rows),
             "shmem.sync_pool": (self.sync_pool, self.end)}
        if self.own_combine_x:
            z["combine_x"] = (self.combine_x, self.combine_x + 2 * t.H * self.rows)
        return z


# ---- UB: each kernel's buffers, in the order its Init / InitBuffer takes them
def notify_build_ub(t: DeepepTiling) -> list[tuple[str, int]]:
    """ReloadRecvData's recvData and the five Align32(E * 4) buffers of the builders."""
    e = align32(4 * t.E)
    return [("recv_data", align32(4 * t.W * t.E)),
            *[(f"build{i}", e) for i in range(5)]]


def pairs_per_core(t: DeepepTiling) -> int:
    """The most (token, k) pairs a core of the dispatch takes (the first BS K % C one more)."""
    return -(-t.BS * t.K // t.cores)


def dispatch_ub(t: DeepepTiling) -> list[tuple[str, int]]:
    """Init (xQueue or QuantInit's queues and fp32 rows), putOffsetBuf, then the core's
    expertIds and sendTokenIdx."""
    h_out = align32(expand_row_bytes(t) + 32)  # hOutUBAlignSize
    if t.quant == "int8":
        bufs = [("x_in0", align32(2 * t.H)), ("x_in1", align32(2 * t.H)),
                ("x_out0", h_out), ("x_out1", h_out),
                ("token_cast_float", 4 * t.H), ("token_abs_float", 4 * t.H)]
    else:
        bufs = [("x_queue0", h_out), ("x_queue1", h_out)]
    n = align32(4 * pairs_per_core(t))
    return [*bufs, ("put_offset", align32(4 * t.W * t.E)), ("expert_ids", n),
            ("send_token_idx", n)]


def combine_ub(t: DeepepTiling) -> list[tuple[str, int]]:
    """ReadBufferFromRemote's buffers: xOut, tokenFloat, weightedMul (Align256),
    sumFloat, the two weightedSumQueue buffers, the token's weights, ids and sendTokenIdx,
    allRecvCount."""
    row, f32 = align32(2 * t.H), align32(4 * t.H)
    k = align32(4 * t.K)
    return [("x_out", row), ("token_float", f32), ("weighted_mul", align256(4 * t.H)),
            ("sum_float", f32), ("weighted_sum0", row), ("weighted_sum1", row),
            ("topk_weights", k), ("topk_idx", k), ("send_token_idx", k),
            ("all_recv_count", align32(4 * t.W * t.E))]


def ub_total(bufs: list[tuple[str, int]]) -> int:
    return sum(n for _, n in bufs)


def sync_all_and_barrier_all(ctx: KernelContext, t: DeepepTiling) -> Wait:
    """SyncAll<true>, then shmem_barrier_all: the rank's cores, then every PE, are done."""
    yield from ctx.sync_all()
    yield from ctx.shmem.barrier_all(ShmemHeap(t).sync_pool)


def then_barrier(t: DeepepTiling, phase: str, body: Callable[[KernelContext, DeepepTiling], Wait],
                 init: Callable[[KernelContext], object] | None = None
                 ) -> Callable[[KernelContext], Wait]:
    """A kernel of one phase `body` (after `init`'s scalar steps), closed by the phase
    "barrier": SyncAll<true> and shmem_barrier_all (the dispatch's and the combine's
    Process)."""

    def program(ctx: KernelContext) -> Wait:
        if init is not None:
            init(ctx)
        with ctx.phase(phase):
            yield from body(ctx, t)
        with ctx.phase("barrier"):
            yield from sync_all_and_barrier_all(ctx, t)

    return program
