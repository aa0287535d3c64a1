"""Family kv_offload (GatherSelectionKvCache): the selection cache checked the way the
operator's test compares it (compare_out_of_order: the slot whose status names a token
holds that token's full row), written here from the inputs; hits stay in place; one-line
errors; the host path's cost per row by hand on round figures; the footprint arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from npusim.errors import InputError
from npusim.scenario import load_scenario
from npusim.sim import simulate

ROUND = {"chip.clock_ghz": 1.0, "scalar.cycles_per_op": 0.0, "vector.issue_cycles": 0.0,
         "mte.gm_to_ub_gbps": 10.0, "mte.put_gbps": 10.0, "mte.gm_to_ub_latency_ns": 100.0,
         "mte.ub_to_gm_gbps": 10.0, "mte.ub_to_gm_latency_ns": 100.0, "hbm.bandwidth_gbps": 1e4,
         "host.latency_ns": 1000.0, "host.npu_link_gbps": 1e4, "host.write_gbps": 1e4,
         "host.read_gbps": 1e4,
         "host.dram_gbps": 1e4, "dcache.miss_ns": 100.0}


def _scenario(tmp: Path, overrides: dict | None = None, **w):
    doc = {"name": "t", "hardware": "atlas_a3",
           "workload": {"kernel": "kv_offload", "op": "gather", "batch": 3, "seq_len": 300,
                        "topk": 64, "block": 16, "reuse": 0.5, **w}}
    if overrides:
        doc["hardware_overrides"] = overrides
    path = tmp / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_scenario(path)


def _inputs(sc):
    fam, w = sc.workload.family, sc.workload
    t = fam.tiling(w.shape, w.options, sc.hardware)
    made = fam.make_inputs(w.shape, w.options, w.op, {"seed": 0}, True)
    return t, fam.op_inputs("gather", t, made, None)[0]


def _check_selection(ins, out, c8: bool, queries: int, topk: int = 64, block: int = 16):
    """compare_out_of_order written from the inputs: per query row, every token of its topk
    sits in the slot its status names with that token's full row; hits kept their slot."""
    full = ins["full_kv_cache"]
    full_kv = full.table[full.pick]
    rope = ins["full_k_rope"]
    sel = out["selection_kv_cache"].reshape(-1, 656 if c8 else 1024)
    rows = ins["selection_topk_indices"].shape[0]
    for r in range(rows):
        b = r // queries
        status = out["selection_kv_block_status"][r]
        prev = ins["selection_kv_block_status_prev"][r]
        assert status[topk] == topk and out["selection_kv_actual_seq"][r] == topk
        for g in ins["selection_topk_indices"][r]:
            (slot,) = np.flatnonzero(status[:topk] == g)
            row = ins["selection_kv_block_table"][r, slot // block] * block + slot % block
            src = ins["full_kv_block_table"][b, g // block] * block + g % block
            assert np.array_equal(sel[row], full_kv[src])
            if not c8:
                rows_r = out["selection_k_rope"].reshape(-1, 128)
                assert np.array_equal(rows_r[row], rope.table[rope.pick[src]])
            if g in prev[:topk]:  # a hit stays where the previous step put it
                assert slot == int(np.flatnonzero(prev[:topk] == g)[0])
    assert out["selection_k_rope"].size == (0 if c8 else rows * topk * 128)


@pytest.mark.parametrize("c8,location,next_n", [(False, "host", 0), (True, "host", 0),
                                                (False, "hbm", 0), (True, "host", 3),
                                                (False, "hbm", 3)])
def test_every_selected_token_sits_in_the_slot_its_status_names(tmp_path, c8, location,
                                                                 next_n):
    sc = _scenario(tmp_path, c8=c8, kv_location=location, next_n=next_n)
    t, ins = _inputs(sc)
    out = simulate(sc).ops[0].outputs[0]
    assert ins["selection_topk_indices"].shape == (3 * (1 + next_n), 64)
    _check_selection(ins, out, c8, 1 + next_n)


def test_mtp_rows_match_the_numpy_reference_bit_for_bit(tmp_path):
    from npusim.kernels.kv_offload.family import reference

    sc = _scenario(tmp_path, c8=False, next_n=3, batch=5)
    t, ins = _inputs(sc)
    out = simulate(sc).ops[0].outputs[0]
    ref = reference(t, ins)
    for name in ("selection_kv_cache", "selection_k_rope", "selection_kv_block_status",
                 "selection_kv_actual_seq"):
        assert np.array_equal(np.asarray(out[name]).reshape(-1),
                              np.asarray(ref[name]).reshape(-1)), name


def test_the_report_counts_misses_and_reuse(tmp_path):
    ff = simulate(_scenario(tmp_path)).ops[0].family_fields
    assert ff["rows_gathered"] == 3 * 32  # half of each sequence's 64 are new
    assert ff["reuse_rate"] == pytest.approx(0.5)
    assert ff["bytes_gathered"] == 3 * 32 * (1024 + 128)


def test_each_row_from_host_costs_one_more_round_trip_than_from_hbm(tmp_path):
    # one sequence on one core: each missed row's two loads queue on MTE2 and the core
    # waits for them before the next row, so host memory adds 2 x 1000 ns per row
    got = {}
    for loc in ("hbm", "host"):
        sc = _scenario(tmp_path, overrides=ROUND, batch=1, kv_location=loc)
        got[loc] = simulate(sc).ops[0].family_fields["gather_us"] * 1000.0
    assert got["host"] - got["hbm"] == pytest.approx(32 * 2000.0, rel=1e-9)


def test_the_footprint_arithmetic(tmp_path):
    ff = simulate(_scenario(tmp_path, layers=61)).ops[0].family_fields
    per_token_layer = 1024 + 128
    assert ff["kv_bytes_per_card_no_offload"] == 3 * 300 * 61 * (per_token_layer + 256)
    assert ff["kv_bytes_per_card_offload"] == 3 * 300 * 61 * 256 + 3 * 64 * 61 * per_token_layer
    assert ff["host_bytes_per_card_offload"] == 3 * 300 * 61 * per_token_layer


def test_bad_inputs_are_one_line(tmp_path):
    for w, key in (({"topk": 301}, "workload.topk"), ({"topk": 32}, "workload.topk"),
                   ({"cache_blocks": 50}, "workload.cache_blocks")):
        with pytest.raises(InputError) as exc:
            _scenario(tmp_path, **w)
        assert key in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, overrides={"host.socket_bytes": 1 << 20}, seq_len=4096)
    assert "above a socket's" in str(exc.value)


def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "hardware": "atlas_a3", "workload": {
        "kernel": "kv_offload", "op": "gather", "seq_len": 1024, "topk": 2048}}))
    out = subprocess.run([sys.executable, "-m", "npusim", "run", str(path), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "workload.topk" in out.stderr
    assert not (tmp_path / "out").exists()


def test_a_later_query_sees_fewer_tokens_and_hits_only_tokens_before_the_step():
    from npusim.kernels.kv_offload.reference import plan

    # query 1 of S = 4 on a 20-token sequence sees 20 - (4 - 1 - 1) = 18 tokens (ids 0..17)
    # and takes hits only up to 18 - 1 - 1 - 1 = 15; 30 is past its range and the -1 is
    # dropped, but the 5 after it is kept (GatherValidTopk masks, it does not stop)
    topk = np.array([17, 16, 15, 3, 30, -1, 5, -1], np.int32)
    status = np.array([16, 15, 3, 7, -1, -1, -1, -1, 4], np.int32)
    moves, new, valid, hits = plan(topk, status, 18, 1)
    assert valid == 5 and hits == 2  # 15 and 3 stay; 16 is above 15, so a miss
    # misses in topk order into the first free slots: 17 -> 0, 16 -> 3, 5 -> 4
    assert [(m.slot, m.token, m.from_slot) for m in moves] == [(0, 17, -1), (3, 16, -1),
                                                              (4, 5, -1)]
    assert new.tolist() == [17, 15, 3, 16, 5, -1, -1, -1, 5]


def test_a_hit_past_the_new_count_moves_down():
    from npusim.kernels.kv_offload.reference import plan

    # one valid id (4), held in slot 3 of a 4-slot status: 3 + 1 - 1 = 3 empty slots below,
    # so the hit moves to slot 0 (CopyFromSelKv from slot 3)
    moves, new, valid, hits = plan(np.array([4, -1, -1, -1], np.int32),
                                   np.array([1, 2, 3, 4, 4], np.int32), 10, 0)
    assert [(m.slot, m.token, m.from_slot) for m in moves] == [(0, 4, 3)]
    assert new.tolist() == [4, -1, -1, -1, 1] and valid == 1 and hits == 1


@pytest.mark.parametrize("rows,cores,split", [(64, 48, (32, 2, 2)), (49, 48, (25, 2, 1)),
                                              (16, 48, (16, 1, 1)), (100, 48, (34, 3, 1))])
def test_the_tiling_splits_rows_into_contiguous_runs(rows, cores, split):
    from npusim.kernels.kv_offload.tiling import KvTiling, core_split

    # DoOpTiling: factor = ceil(rows / cores), used = ceil(rows / factor), factor again
    # ceil(rows / used), the last core the rest; e.g. 100 on 48: 3, 34, 3, 100 - 33 * 3 = 1
    assert core_split(rows, cores) == split
    t = KvTiling(rows, 4096, 64, 16, False, "hbm", 0.5, 0, 1, cores)
    used, main, tail = split
    taken = [list(t.rows_of(c)) for c in range(cores)]
    assert taken[0] == list(range(main)) and taken[used - 1] == list(range(rows - tail, rows))
    assert sum(taken, []) == list(range(rows)) and t.cores == used


def test_each_block_table_line_a_core_reads_costs_one_fill(tmp_path):
    # one sequence on one core: its misses read their block numbers from the full block
    # table in GM one scalar load each; each 64 B line of it first touched (16 entries)
    # and the sequence's length cost a fill, so a fill 1000 ns dearer adds 1000 ns each
    sc = _scenario(tmp_path, overrides=ROUND, batch=1, kv_location="hbm")
    t, ins = _inputs(sc)
    misses = set(ins["selection_topk_indices"][0]) - set(ins["selection_kv_block_status_prev"][0])
    lines = {(g // 16) // 16 for g in misses}  # entry token // block, 16 int32 a line
    got = {}
    for miss in (100.0, 1100.0):
        sc = _scenario(tmp_path, overrides={**ROUND, "dcache.miss_ns": miss}, batch=1,
                       kv_location="hbm")
        got[miss] = simulate(sc).ops[0].family_fields["gather_us"] * 1000.0
    assert len(misses) == 32
    assert got[1100.0] - got[100.0] == pytest.approx(1000.0 * (len(lines) + 1), rel=1e-9)


def test_the_step_figures(tmp_path):
    a = simulate(_scenario(tmp_path, c8=True, next_n=3)).ops[0].family_fields
    assert a["queries"] == 4 and a["query_rows"] == 12 and a["rows_gathered"] == 12 * 32
    assert a["bytes_gathered"] == 12 * 32 * 656  # c8: one 656 B row, no rope
    assert a["per_step_us"] == pytest.approx(61 * a["gather_us"])
    assert a["step_share"] == pytest.approx([a["per_step_us"] / 1000 / 18.85,
                                             a["per_step_us"] / 1000 / 25.8])
    # the selection pool is per query row: B * S * TOPK rows a layer; the c8 indexer key
    # is 128 int8 + an fp16 scale
    assert a["kv_bytes_per_card_offload"] == 3 * 300 * 61 * 130 + 12 * 64 * 61 * 656


def test_offload_copies_the_layer_cache_into_host_memory(tmp_path):
    sc = _scenario(tmp_path, op="offload", batch=2, seq_len=100)
    fam, w = sc.workload.family, sc.workload
    t = fam.tiling(w.shape, w.options, sc.hardware)
    ins = fam.op_inputs("offload", t, fam.make_inputs(w.shape, w.options, "offload",
                                                     {"seed": 0}, True), None)[0]
    op = simulate(sc).ops[0]
    rows = 2 * 7 * 16  # 2 sequences of ceil(100 / 16) = 7 blocks of 16 tokens
    for name, width in (("kv_cache", 1024), ("k_rope", 128)):
        src = ins[f"layer_{name}"]
        assert np.array_equal(op.outputs[0][f"full_{name}"].reshape(rows, width),
                              src.table[src.pick])
    ff = op.family_fields
    assert ff["bytes_offloaded"] == rows * (1024 + 128)
    assert ff["per_prefill_bytes"] == 61 * rows * (1024 + 128)
    assert ff["offload_gbps"] == pytest.approx(ff["bytes_offloaded"] / (ff["offload_us"] * 1e3))


def test_offload_needs_host_memory(tmp_path):
    with pytest.raises(InputError) as exc:
        _scenario(tmp_path, op="offload", kv_location="hbm")
    assert "workload.kv_location" in str(exc.value) and "\n" not in str(exc.value)


def _one_id_left(monkeypatch, row: int):
    """Inputs whose query row `row` keeps only the id its status holds in the last slot
    (then 63 slots below it are free, so the hit moves down to slot 0)."""
    from npusim.kernels.kv_offload import family

    made = family.step_inputs

    def step_inputs(t, seed, payload):
        ins = made(t, seed, payload)
        topk = np.full_like(ins["selection_topk_indices"][row], -1)
        topk[0] = ins["selection_kv_block_status_prev"][row][63]
        ins["selection_topk_indices"][row] = topk
        return ins
    monkeypatch.setattr(family, "step_inputs", step_inputs)


def test_a_moved_hit_of_the_first_query_is_copied_within_its_pool(tmp_path, monkeypatch):
    from npusim.kernels.kv_offload.family import reference

    _one_id_left(monkeypatch, 0)
    sc = _scenario(tmp_path, batch=1, next_n=1)
    t, ins = _inputs(sc)
    out = simulate(sc).ops[0].outputs[0]
    g = ins["selection_topk_indices"][0][0]
    status = out["selection_kv_block_status"][0]
    assert status[0] == g and status[64] == 1 and (status[1:64] == -1).all()
    # slot 0 now holds what slot 63 held: the token's row, as the previous step left it
    sel = out["selection_kv_cache"].reshape(-1, 1024)
    assert np.array_equal(sel[0], ins["selection_kv_cache_prev"].reshape(-1, 1024)[63])
    ref = reference(t, ins)
    assert np.array_equal(out["selection_kv_cache"].reshape(-1),
                          ref["selection_kv_cache"].reshape(-1))


def test_a_moved_hit_of_a_later_query_is_refused(tmp_path, monkeypatch):
    _one_id_left(monkeypatch, 1)
    with pytest.raises(Exception) as exc:
        simulate(_scenario(tmp_path, batch=1, next_n=1))
    assert "CopyFromSelKv for query 1" in str(exc.value)


def _walked_pages(ins, t, page: int, entries: int) -> int:
    """The misses of a cache of `entries` pages (least recently used out) that starts with
    the tensor's first pages, over the pages of the full-cache rows the one query row
    gathers, in topk order (the kernel's rule, reference.plan)."""
    from collections import OrderedDict

    from npusim.kernels.kv_offload.reference import plan

    status = np.array(ins["selection_kv_block_status_prev"][0])
    moves, *_ = plan(ins["selection_topk_indices"][0], status, t.seq_len, 0)
    cached = OrderedDict.fromkeys(range(entries))
    misses = 0
    for m in moves:
        row = int(ins["full_kv_block_table"][0, m.token // t.block]) * t.block + m.token % t.block
        for p in range(row * t.kv_bytes // page, ((row + 1) * t.kv_bytes - 1) // page + 1):
            if p in cached:
                cached.move_to_end(p)
                continue
            misses += 1
            cached[p] = None
            if len(cached) > entries:
                cached.popitem(last=False)
    return misses


def test_swapped_memory_walks_its_base_pages_and_shmem_host_none(tmp_path):
    # one query row on one core, c8 (one 656 B row a token): each missed row's load waits
    # before the next, so every walk (1000 ns, one at a time) adds to the call. The full
    # cache is 304 rows x 656 B: one 2 MiB page (cached from the start), or 49 pages of
    # 4 KiB of which a 2-entry cache holds the first two
    walks = {**ROUND, "host.page_walk_ns": 1000.0, "host.tlb_entries": 2, "host.walkers": 1,
             "host.page_bytes": 4096, "host.huge_page_bytes": 2 << 20}
    ff = {m: simulate(_scenario(tmp_path, overrides=walks, batch=1, c8=True, memory=m)
                      ).ops[0].family_fields for m in ("shmem_host", "swapped")}
    t, ins = _inputs(_scenario(tmp_path, overrides=walks, batch=1, c8=True))
    misses = _walked_pages(ins, t, 4096, 2)
    assert ff["shmem_host"]["host_page_bytes"] == 2 << 20
    assert ff["swapped"]["host_page_bytes"] == 4096
    assert ff["shmem_host"]["translation_misses"] == 0
    assert ff["swapped"]["translation_misses"] == misses > 32 // 2
    assert (ff["swapped"]["gather_us"] - ff["shmem_host"]["gather_us"]) * 1000.0 == \
        pytest.approx(1000.0 * misses, rel=1e-9)


def test_offload_is_two_memcpy_async_on_one_stream_then_its_synchronize(tmp_path):
    # per tensor the host's call (100 ns), then one SQE: the engine holds for the host
    # write's round trip (2 x 1000 ns), streams at 10 GB/s and lands 100 ns after; the
    # rope copy starts when the kv copy has completed (one stream). 224 rows of 1024 B
    # and 128 B
    over = {**ROUND, "sdma.bandwidth_gbps": 10.0, "sdma.latency_ns": 100.0,
            "host.memcpy_async_ns": 100.0, "host.page_walk_ns": 1000.0,
            "host.tlb_entries": 2, "host.walkers": 1, "host.page_bytes": 4096}
    got = {m: simulate(_scenario(tmp_path, overrides=over, op="offload", batch=2,
                                 seq_len=100, memory=m)).ops[0].family_fields
           for m in ("shmem_host", "swapped")}
    kv, rope = 224 * 1024, 224 * 128
    one = 100.0 + 2000.0 + kv / 10.0 + 100.0
    assert got["shmem_host"]["offload_us"] * 1000.0 == pytest.approx(
        one + 2000.0 + rope / 10.0 + 100.0, rel=1e-9)
    # swapped: 56 pages of kv (the first two cached at the start) and 7 of rope (no room
    # left to start cached), each walked alone before the copy's bytes
    assert got["swapped"]["translation_misses"] == 54 + 7
    assert (got["swapped"]["offload_us"] - got["shmem_host"]["offload_us"]) * 1000.0 == \
        pytest.approx(61 * 1000.0, rel=1e-9)
