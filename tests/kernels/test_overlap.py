"""The overlap figures of a fused launch, on notes made by hand: unions, intersections and
the per-tag split, each checked against interval arithmetic done here."""

from __future__ import annotations

from types import SimpleNamespace

from npusim.kernels.common.overlap import Notes, intersect, layer_fields, length, union
from npusim.kernels.kernel import CoreTiming


def _op(a: float, b: float | None) -> SimpleNamespace:
    return SimpleNamespace(start_at=a, done_at=b)


def _span(rank: int, core: int, name: str, a: float, b: float) -> SimpleNamespace:
    return SimpleNamespace(lane="phase", rank=rank, core=core, name=name, start_ns=a, end_ns=b)


def test_union_merges_touching_and_drops_empty_intervals() -> None:
    assert union([(5, 7), (0, 2), (2, 3), (4, 4), (6, 9)]) == [(0, 3), (5, 9)]
    assert length([(0, 3), (5, 9)]) == 7
    assert intersect([(0, 3), (5, 9)], [(2, 6), (8, 20)]) == 1 + 1 + 1


def _launch() -> tuple[SimpleNamespace, list[list[CoreTiming]]]:
    """Two ranks of one MIX block (AIC, AIV0, AIV1). Rank 0: dispatch puts [0, 10) and
    [20, 30), combine put [50, 70); gmm1 on the AIC [5, 25), gmm2 [40, 60), a vector op
    [28, 32). Rank 1: a dispatch put [0, 4), an unfinished put (no delivery), gmm1 [10, 20)."""
    r0 = [Notes(), Notes(), Notes()]
    r0[1].remote += [("dispatch", _op(0, 10)), ("dispatch", _op(20, 30))]
    r0[2].remote += [("combine", _op(50, 70))]
    r0[0].compute += [("gmm1", 5, 25), ("gmm2", 40, 60)]
    r0[1].compute += [("vector", 28, 32)]
    r1 = [Notes(), Notes(), Notes()]
    r1[1].remote += [("dispatch", _op(0, 4)), ("combine", _op(3, None))]
    r1[0].compute += [("gmm1", 10, 20)]
    kinds = [("aic", 0), ("aiv", 0), ("aiv", 1)]
    cores = [[CoreTiming(k, s, n) for (k, s), n in zip(kinds, row, strict=True)]
             for row in (r0, r1)]
    spans = [_span(0, 0, "gmm1", 5, 25), _span(0, 1, "gmm1", 0, 26), _span(1, 0, "gmm1", 10, 20),
             _span(0, 2, "combine", 30, 70), _span(0, 1, "combine", 30, 35)]
    run = SimpleNamespace(spans=spans, phase_order=["gmm1", "combine"],
                          core_busy_ns=[[{"cube": 20.0, "mte2": 9.0}, {"vector": 4.0}, {}],
                                        [{"cube": 10.0}, {}, {}]])
    return run, cores


def test_layer_fields_split_dispatch_behind_gmm1_and_combine_behind_gmm2() -> None:
    run, cores = _launch()
    out = layer_fields(run, cores, {"gmm1": "aic", "combine": "aiv1"},
                       {"dispatch": ("gmm1",), "combine": ("gmm2",)})
    # dispatch: rank 0 has 20 ns, of which [5, 10) and [20, 25) are under gmm1: 10 hidden;
    # rank 1 has 4 ns, none under gmm1 [10, 20). Means over the two ranks.
    d = out["overlap"]["dispatch"]
    assert d["communication_us"] == round((20 + 4) / 2 / 1e3, 4)
    assert d["hidden_us"] == round(10 / 2 / 1e3, 4)
    assert d["exposed_us"] == round(14 / 2 / 1e3, 4)
    # combine: rank 0's put [50, 70) under gmm2 [40, 60): 10 of 20; rank 1's never landed
    c = out["overlap"]["combine"]
    assert (c["communication_us"], c["hidden_us"]) == (round(10 / 1e3, 4), round(5 / 1e3, 4))
    # all tags together, rank 0: C = [0,10)+[20,30)+[50,70) = 40, X = [5,25)+[28,32)+[40,60);
    # C and X = 5 + 5 (gmm1) + 2 ([28, 30) vector) + 10 = 22
    r0 = out["communication_per_rank"][0]
    assert (r0["communication_us"], r0["hidden_us"]) == (0.04, 0.022)
    # stages: gmm1 on the AICs only (AIV0's [0, 26) is waiting), combine on AIV1 only
    assert out["stage_us"] == {"gmm1": round(20 / 1e3, 4), "combine": round(40 / 1e3, 4)}
    assert out["critical_stage"] == "combine"
    assert out["busy_us_total"] == {"aic_cube": 0.03, "aiv_vector": 0.004}


def test_a_waiting_stage_is_never_critical() -> None:
    run, cores = _launch()
    out = layer_fields(run, cores, {"gmm1": "aic", "combine": "aiv1"}, {}, waits=("combine",))
    assert out["critical_stage"] == "gmm1" and out["overlap"] == {}
