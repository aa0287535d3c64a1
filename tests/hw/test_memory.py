"""GM regions on their own: the window's sparse backing and tensors of shared rows."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from npusim.hw.memory import (
    DenseRegion,
    RowTable,
    RowTableRegion,
    SparseRegion,
    Watcher,
    is_zero,
    paged_zeros,
)
from tests.hw.pagemap import entries


def _rows() -> tuple[RowTable, np.ndarray]:
    rng = np.random.default_rng(3)
    table = rng.integers(0, 256, size=(3, 16), dtype=np.uint8)
    pick = np.array([2, 0, 2, 1])
    dense = np.zeros(6 * 16, np.uint8)  # 6 rows, the last two never given
    for i, j in enumerate(pick):
        dense[16 * i:16 * i + 16] = table[j]
    return RowTable(table, pick, 6), dense


def test_row_table_reads_like_the_dense_tensor_it_stands_for():
    rows, dense = _rows()
    region = RowTableRegion("expand_x", 0, rows)
    assert region.nbytes == dense.size
    for offset, n in [(0, 16), (16, 16), (5, 40), (60, 36), (64, 32), (0, 96), (90, 6)]:
        assert np.array_equal(region.read(offset, n), dense[offset:offset + n]), (offset, n)
    out = np.full(20, 7, np.uint8)
    region.read_into(40, out)
    assert np.array_equal(out, dense[40:60])
    assert np.array_equal(region.as_array(np.uint8, (6, 16)), dense.reshape(6, 16))


def test_row_table_write_makes_a_private_copy_and_tells_watchers():
    rows, dense = _rows()
    before = rows.table.copy()
    region = RowTableRegion("expand_x", 0, rows)
    seen = []
    region.watch(Watcher(20, 4, lambda: seen.append(1)))
    region.write(18, np.array([1, 2, 3, 4], np.uint8))
    dense[18:22] = [1, 2, 3, 4]
    assert np.array_equal(region.read(0, 96), dense)
    assert np.array_equal(rows.table, before)  # the shared table is untouched
    assert seen == [1]


def test_window_reads_zeros_where_nothing_was_written_and_the_bytes_where_it_was():
    win = SparseRegion("window", 0, 1 << 30)
    win.write((1 << 30) - 8, np.arange(8, dtype=np.uint8))
    win.write(4090, np.arange(10, dtype=np.uint8))  # across a 4 KiB page boundary
    assert np.array_equal(win.read(4088, 14), [0, 0, *range(10), 0, 0])
    assert np.array_equal(win.read((1 << 30) - 10, 10), [0, 0, *range(8)])
    assert not win.read(1 << 20, 4096).any()


def test_ub_written_bits_agree_with_a_byte_per_byte_record():
    from npusim.hw.ub import UnifiedBuffer

    rng = np.random.default_rng(11)
    for _ in range(40):
        ub = UnifiedBuffer(4096, 32)
        ref = np.zeros(4096, bool)
        for _ in range(12):
            start = int(rng.integers(0, 4000))
            if rng.random() < 0.5:
                n = int(rng.integers(0, 4096 - start))
                ub.mark(start, n)
                ref[start:start + n] = True
                if n:  # a piece of the run just marked: every bit set, at any alignment
                    a = start + int(rng.integers(0, n))
                    assert ub.unwritten(a, int(rng.integers(1, start + n - a + 1))) == -1
            else:
                length = int(rng.integers(1, 40))
                pitch = length + int(rng.integers(1, 40))
                count = int(rng.integers(1, (4096 - start - length) // pitch + 2))
                ub.mark_blocks(start, count, length, pitch)
                for i in range(count):
                    ref[start + i * pitch:start + i * pitch + length] = True
            for _ in range(8):
                a = int(rng.integers(0, 4096))
                n = int(rng.integers(1, 4097 - a))
                span = ref[a:a + n]
                want = -1 if span.all() else a + int(np.argmin(span))
                assert ub.unwritten(a, n) == want, (a, n)
        ub.high = 4096
        ub.reset(new_call=True)
        assert ub.unwritten(0, 4096) == 0


def test_a_window_this_machine_cannot_map_is_out_of_memory_not_bad_input(monkeypatch):
    """1 GiB is within what window.bytes allows: a map the OS refuses is the machine's
    memory running short (exit 1), not the user's input (exit 2)."""
    def refuse(*_a, **_k):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    with pytest.raises(MemoryError, match=f"cannot map {1 << 30} B for rank 3's window"):
        SparseRegion("window", 3, 1 << 30)


@pytest.mark.parametrize("nbytes", [0, 4096, (1 << 20) + 7])
def test_paged_zeros_is_a_writable_zero_buffer_of_the_size_asked(nbytes):
    buf = paged_zeros(nbytes, "a test buffer")
    assert buf.dtype == np.uint8 and buf.size == nbytes and not buf.any()
    buf[nbytes // 2:] = 9  # writable, and only where written
    assert int(buf.sum()) == 9 * (nbytes - nbytes // 2)


def _present_pages(arr: np.ndarray) -> int | None:
    """Pages of arr the OS has backed (or mapped to its zero page); None where that is not
    readable."""
    found = entries(arr)
    return None if found is None else sum(e >> 63 & 1 for e in found)


def test_zeros_change_a_written_block_and_skip_one_never_written():
    """Written marks are per 64 KiB block: zeros written where non-zero bytes were (in
    either of two blocks a write spans) replace them; zeros onto a block never written
    are not stored, and its pages stay unbacked."""
    win = SparseRegion("window", 0, 1 << 24)
    block = 1 << 16
    win.write(block - 4, np.full(8, 7, np.uint8))  # the end of block 0, the start of block 1
    win.write(block + 2, np.zeros(2, np.uint8))  # within block 1 only
    assert np.array_equal(win.read(block - 4, 8), [7, 7, 7, 7, 7, 7, 0, 0])
    win.write(block - 8, np.zeros(16, np.uint8))
    assert not win.read(block - 16, 32).any()
    win.write(5 * block + 100, np.zeros(3 * 4096, np.uint8))  # block 5: never written
    present = _present_pages(win.buf[5 * block:6 * block])
    if present is not None:
        assert present == 0
    assert not win.read(5 * block, block).any()


@pytest.mark.parametrize("n", [0, 1, 31, 7424, 14336, (1 << 16) + 1, 3 << 20])
def test_is_zero_is_true_only_when_every_byte_is_zero(n):
    """Against a byte-by-byte walk: zeros, one non-zero byte at the start, the middle or
    the end, and a strided view (below and above the size compared as bytes)."""
    data = np.zeros(n, np.uint8)
    assert is_zero(data) and is_zero(data[::2])
    for at in sorted({0, n // 2, n - 1}) if n else []:
        data[at] = 128
        assert is_zero(data) is (not any(int(b) for b in data.tobytes()))
        assert is_zero(data[at % 2::2]) is False
        data[at] = 0
    assert is_zero(data)


def test_is_zero_answers_the_same_once_it_keeps_no_more_runs_of_zeros(monkeypatch):
    """Past the sizes it keeps a run of zeros for, a size is counted in place."""
    from npusim.hw import memory

    monkeypatch.setattr(memory, "_ZEROS", {i: bytes(i) for i in range(memory.ZERO_TEST_SIZES)})
    data = np.zeros(1000, np.uint8)
    assert is_zero(data)
    data[999] = 1
    assert not is_zero(data)
    assert 1000 not in memory._ZEROS


def test_zeros_onto_a_block_never_written_still_wake_a_watcher():
    """Zeros landing on zeros store nothing, yet a poll watching those bytes is told (it
    re-reads them: the event order of a run does not depend on whether bytes moved)."""
    win = SparseRegion("window", 0, 1 << 24)
    seen = []
    w = Watcher(3 << 16, 64, lambda: seen.append("woken"))
    win.watch(w)
    win.write((3 << 16) + 32, np.zeros(7424, np.uint8))
    assert seen == ["woken"]
    assert not win._written[3]
    win.write((3 << 16) + 32, np.full(4, 9, np.uint8))
    assert seen == ["woken", "woken"] and win._written[3]


def test_a_large_gm_tensor_reads_zeros_until_written():
    region = DenseRegion("expand_x", 0, 3 << 20)  # above the small-page threshold
    assert not region.read(0, 3 << 20).any()
    region.write((2 << 20) + 5, np.arange(10, dtype=np.uint8))
    assert np.array_equal(region.read((2 << 20) + 5, 10), np.arange(10))
    assert not region.read(0, 2 << 20).any()


def test_every_core_has_its_own_zeroed_ub_and_write_marks():
    """A rank's UBs are slices of one map: each of capacity bytes, none overlapping, so a
    write through one core's UB (and its marks) shows in no other."""
    from npusim.engine.env import SimEnv
    from npusim.hw.config import load_hardware
    from npusim.hw.machine import Rank

    cfg = load_hardware("ascend950")
    rank = Rank(SimEnv(), 3, cfg)
    ubs = [core.ub for core in rank.cores]
    assert len(ubs) == cfg.chip.aiv_cores
    cap = cfg.ub.bytes
    for i, ub in enumerate(ubs):
        assert ub.data.size == cap and ub.written.size == cap // 8
        assert not ub.data.any() and not ub.written.any()
        ub.data[[0, cap - 1]] = i + 1
        ub.mark(cap - 8, 8)
    for i, ub in enumerate(ubs):
        assert ub.data[0] == ub.data[cap - 1] == i + 1
        assert np.count_nonzero(ub.data) == 2
        assert ub.unwritten(0, cap - 8) == 0 and ub.unwritten(cap - 8, 8) == -1


def test_strided_blocks_are_views_of_the_blocks_a_loop_slices():
    """strided_blocks gives the blocks `pitch` apart as a view (writes land in the span),
    on a contiguous span and on one that is not (every other byte of a buffer)."""
    from npusim.hw.ub import strided_blocks

    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, size=600, dtype=np.uint8)
    for span in (base[7:7 + 3 * 40 + 12], base[::2][:3 * 40 + 12]):
        want = np.stack([span[i * 40:i * 40 + 12].copy() for i in range(4)])
        got = strided_blocks(span, 4, 12, 40)
        assert got.shape == (4, 12)
        assert (got == want).all()
        got[2, 3] = want[2, 3] ^ 0xFF
        assert span[2 * 40 + 3] == want[2, 3] ^ 0xFF
    rep = strided_blocks(base[:5], 3, 5, 0)  # pitch 0 repeats the first block
    assert (rep == base[:5]).all()
    with pytest.raises(ValueError):
        strided_blocks(base[:100], 3, 12, 45)  # needs 2 * 45 + 12 = 102 bytes


def _strict_overcommit() -> bool:
    """vm.overcommit_memory 2 counts every map, MAP_NORESERVE or not."""
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "2"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or _strict_overcommit(),
                    reason="Linux's heuristic overcommit")
def test_windows_larger_than_the_machine_in_all_still_let_the_process_fork():
    """A SHMEM run maps an 8 GiB heap per rank: windows of more than the machine's memory
    in all, of which a run writes megabytes. They commit nothing, so a fork (a second
    worker, a sweep's point) still succeeds while they are mapped."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    each = 1 << 33
    windows = [SparseRegion("window", r, each) for r in range(ram // each + 2)]
    windows[-1].write(each - 8, np.arange(8, dtype=np.uint8))
    pid = os.fork()
    if pid == 0:
        os._exit(0 if windows[-1].read(each - 8, 8).tolist() == list(range(8)) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


class _NaivePuts:
    """A call's puts as a plain list, scanned whole: the race check's rules."""

    def __init__(self) -> None:
        self.puts: list[tuple[int, int, int, int, str]] = []

    def claim(self, offset: int, nbytes: int, who: tuple[int, int, str]) -> str | None:
        if nbytes <= 0:
            return None
        hit = [p for p in self.puts if p[0] < offset + nbytes and offset < p[1]]
        if hit:  # the lowest: the put the new one starts in, if any, else the next one
            a, b, rank, core, step = min(hit)
            return f"rank {rank} core {core} {step} [0x{a:x}, 0x{b:x})"
        self.puts = sorted([*self.puts, (offset, offset + nbytes, *who)])
        return None

    def release(self, offset: int, nbytes: int) -> None:
        self.puts = [p for p in self.puts if not (p[0] < offset + nbytes and offset < p[1])]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_put_claims_and_releases_agree_with_a_plain_list(monkeypatch, seed):
    """Many puts (buckets of 2 to 4, so they split often) and releases over a small range:
    every answer and the puts kept, in order, as a list scanned whole gives them."""
    monkeypatch.setattr(sys.modules[SparseRegion.__module__], "PUTS_PER_BUCKET", 2)
    rng = np.random.default_rng(seed)
    win, ref = SparseRegion("window", 0, 1 << 20), _NaivePuts()
    answers = 0
    for i in range(1500):
        offset, n = int(rng.integers(0, 4000)), int(rng.integers(-1, 40))
        if rng.random() < 0.08:
            ref.release(offset, 4 * n)
            win.release(offset, 4 * n)
        else:
            who = (i % 5, i % 3, f"step{i % 4}")
            got = win.claim(offset, n, who)
            assert got == ref.claim(offset, n, who)
            answers += got is not None
        assert win.puts() == ref.puts
    assert answers > 100 and len(win._put_buckets) > 5  # races and splits both happened
    win.new_call()
    assert win.puts() == [] and win.claim(7, 1, (0, 0, "x")) is None
