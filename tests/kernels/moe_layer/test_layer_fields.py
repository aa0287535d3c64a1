"""The layer's figures over a run's kernels, on runs made by hand."""

from __future__ import annotations

from types import SimpleNamespace

from npusim.kernels.moe_layer.layer import layer_fields


def _run(op: str, a: float, b: float, fields: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(op=op, start_ns=a, end_ns=b, family_fields=fields or {})


def test_a_chain_sums_its_kernels() -> None:
    runs = [_run("dispatch", 0, 60_000), _run("gmm1", 60_000, 72_000),
            _run("combine", 72_000, 92_500)]
    out = layer_fields(runs)
    assert out[:2] == [{}, {}]
    assert out[2] == {"layer_latency_us": 60 + 12 + 20.5,
                      "layer_ops_us": {"dispatch": 60.0, "gmm1": 12.0, "combine": 20.5}}


def test_a_fused_kernel_adds_its_hidden_and_exposed_communication() -> None:
    overlap = {"dispatch": {"communication_us": 30.0, "hidden_us": 20.0, "exposed_us": 10.0},
               "combine": {"communication_us": 12.5, "hidden_us": 2.5, "exposed_us": 10.0}}
    (only,) = layer_fields([_run("fused_deep_moe", 1_000, 401_000, {"overlap": overlap})])
    assert only["layer_latency_us"] == 400.0
    assert (only["communication_hidden_us"], only["communication_exposed_us"]) == (22.5, 20.0)


def test_no_runs_no_figures() -> None:
    assert layer_fields([]) == []
