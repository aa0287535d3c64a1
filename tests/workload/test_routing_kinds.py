"""Log-normal routing and routing read from a .npy file (docs/scenario.md, "Routing").

Expected values are derived here, independently of the code under test: Plackett-Luce
probabilities by hand from the weights, the log-variance of log-normal loads from the
definition (Var log w = sigma^2), expert counts with numpy's bincount of the ids written.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli import main
from npusim.errors import InputError
from npusim.report.build import build_report
from npusim.scenario import load_scenario
from npusim.sim import load_inputs, simulate
from npusim.workload.inputs import generate_inputs, recv_counts
from npusim.workload.routing import lognormal_routing, make_routing, weighted_distinct
from npusim.workload.shape import MoeShape
from tests.kernels.cann_sample.samplehelp import scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "scenarios" / "examples"


# --------------------------------------------------------------------------- lognormal draws
def test_lognormal_deterministic_distinct_in_range() -> None:
    a = make_routing("lognormal", 4, 200, 6, 16, rng=np.random.default_rng(7), sigma=1.0)
    b = make_routing("lognormal", 4, 200, 6, 16, rng=np.random.default_rng(7), sigma=1.0)
    c = make_routing("lognormal", 4, 200, 6, 16, rng=np.random.default_rng(8), sigma=1.0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    for ids in a:
        assert ids.shape == (200, 6) and ids.dtype == np.int32
        assert ids.min() >= 0 and ids.max() < 16
        assert all(len(set(row)) == 6 for row in ids.tolist())


@pytest.mark.parametrize("weights", [[4.0, 2.0, 1.0, 1.0], [1000.0, 1.0, 1.0, 1.0]],
                         ids=["mild", "one-expert-takes-all"])
def test_weighted_distinct_is_plackett_luce(weights: list[float]) -> None:
    # P(i, j, k) = w_i / S * w_j / (S - w_i) * w_k / (S - w_i - w_j), by hand. The skewed
    # weights leave most rows short of 3 distinct ids after 6 draws: the Gumbel completion.
    n, K = 120_000, 3
    ids = weighted_distinct(np.log(np.array(weights)), n, K, np.random.default_rng(1))
    assert ids.shape == (n, K) and all(len(set(r)) == K for r in ids[:2000].tolist())
    S = sum(weights)
    seen = {t: 0 for t in itertools.permutations(range(4), K)}
    for t, c in zip(*np.unique(ids, axis=0, return_counts=True), strict=True):
        seen[tuple(int(v) for v in t)] = int(c)
    for (i, j, k), c in seen.items():
        p = (weights[i] / S * weights[j] / (S - weights[i])
             * weights[k] / (S - weights[i] - weights[j]))
        assert abs(c / n - p) <= 5 * math.sqrt(p * (1 - p) / n) + 2 / n, ((i, j, k), c / n, p)


@pytest.mark.parametrize("sigma,E", [(0.5, 1024), (1.0, 256)])
def test_lognormal_loads_have_log_variance_sigma_squared(sigma: float, E: int) -> None:
    # A token's first pick has p_e = w_e / sum w, so the count c_e of first picks is
    # Poisson-like around N p_e and Var_e(log c_e) = Var(log w) + E[1 / c] = sigma^2 + E[1/c]
    # (delta method). The sample variance of E normals has sd sigma^2 sqrt(2 / (E - 1)):
    # 0.011 and 0.089 here; the bound is 4 of those.
    W, BS, K = 8, 25_000, 8
    ids = lognormal_routing(W, BS, K, E, np.random.default_rng(3), sigma=sigma)
    first = np.concatenate([a[:, 0] for a in ids])
    c = np.bincount(first, minlength=E).astype(float)
    assert c.min() > 0
    got = np.var(np.log(c), ddof=1) - np.mean(1 / c)
    assert abs(got - sigma**2) <= 4 * sigma**2 * math.sqrt(2 / (E - 1)), (got, sigma**2)
    # the experts' whole loads are skewed too, if less (K distinct caps the hottest)
    load = np.bincount(np.concatenate(ids).ravel(), minlength=E).astype(float)
    uniform = np.bincount(np.concatenate(make_routing(
        "uniform", W, BS // 10, K, E, rng=np.random.default_rng(3))).ravel(), minlength=E)
    assert np.std(np.log(load)) > 0.5 * sigma > np.std(np.log(uniform))


def test_lognormal_at_the_kernel_limits() -> None:
    # BS 512, W 768, K 16 (E = 768 experts): 6.3 M ids. Not a timing test, a size test: the
    # draw is O(BS K) per rank, so it completes at this size with distinct ids in range.
    ids = lognormal_routing(768, 512, 16, 768, np.random.default_rng(0), sigma=1.0)
    flat = np.stack(ids)
    assert flat.shape == (768, 512, 16)
    s = np.sort(flat, axis=2)
    assert not (s[:, :, 1:] == s[:, :, :-1]).any() and s.min() >= 0 and s.max() < 768


def test_lognormal_with_shared_experts_names_only_moe_experts() -> None:
    # W 6, S 1 on S_r 2 ranks, L 4: E = (6 - 2) * 4 = 16 MoE experts on ranks 2..5; the
    # shared ranks take no routed experts, only every token of the ranks r with
    # r mod R == d mod R (R = S_r / S = 2): 3 ranks * BS tokens each.
    inp = generate_inputs(MoeShape(W=6, BS=64, H=1024, K=4, L=4, S=1, S_r=2),
                          routing="lognormal", seed=2, sigma=1.0)
    flat = np.concatenate(inp.expert_ids).ravel()
    assert flat.min() >= 0 and flat.max() < 16
    moe = np.bincount(flat // 4, minlength=4)
    assert inp.recv_counts == [3 * 64, 3 * 64, *moe.tolist()]


def test_lognormal_dispatch_counts_from_the_simulator(tmp_path: Path) -> None:
    sc = scenario(tmp_path, bs=16, k=4, ep_world_size=6, experts_per_rank=4, shared_experts=1,
                  shared_expert_ranks=2, routing={"kind": "lognormal", "sigma": 1.5, "seed": 4})
    ids = [r["expert_ids"] for r in load_inputs(sc)]
    want = np.bincount(np.concatenate(ids).ravel(), minlength=16).reshape(4, 4)
    out = simulate(sc).ops[0].outputs
    for d in range(2, 6):
        assert out[d]["expert_token_nums"].tolist() == want[d - 2].tolist(), d
    assert [out[d]["expert_token_nums"].tolist() for d in (0, 1)] == [[3 * 16], [3 * 16]]


# --------------------------------------------------------------------------- scenario keys
def _doc(routing: dict[str, Any], **w: Any) -> dict[str, Any]:
    return {"name": "r", "workload": {"op": "dispatch", "bs": 16, "h": 1024, "k": 4,
                                      "ep_world_size": 4, "experts_per_rank": 4, **w,
                                      "routing": routing}}


def _write(tmp: Path, doc: dict[str, Any], name: str = "r.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(doc))
    return p


def test_lognormal_sigma_default_and_resolved(tmp_path: Path) -> None:
    sc = load_scenario(_write(tmp_path, _doc({"kind": "lognormal"})))
    assert sc.workload.routing.sigma == 1.0
    assert sc.to_dict()["workload"]["routing"] == {"kind": "lognormal", "seed": 0, "sigma": 1.0}


@pytest.mark.parametrize("routing,key,text", [
    ({"kind": "lognormal", "sigma": 0}, "sigma", "out of range; allowed: (0, 10]"),
    ({"kind": "lognormal", "sigma": -1.0}, "sigma", "out of range"),
    ({"kind": "lognormal", "sigma": 10.5}, "sigma", "out of range"),
    ({"kind": "lognormal", "sigma": "wide"}, "sigma", "must be a number"),
    ({"kind": "zipf", "sigma": 1.0}, "sigma", "only used with kind: lognormal"),
    ({"kind": "lognormal", "s": 1.2}, "s", "only used with kind: zipf"),
    ({"kind": "lognormal", "path": "ids.npy"}, "path", "only used with kind: file"),
    ({"kind": "file"}, "path", "missing (required with kind: file)"),
    ({"kind": "file", "path": 3}, "path", "must be a non-empty string"),
    ({"kind": "file", "path": "ids.npy", "sigma": 1}, "sigma", "only used with kind: lognormal"),
])
def test_routing_keys_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      routing: dict[str, Any], key: str, text: str) -> None:
    path = _write(tmp_path, _doc(routing))
    assert main(["lint", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"npusim: error: {path}: workload.routing.{key}: "), err
    assert text in err, err


# --------------------------------------------------------------------------- routing files
def _ids(W: int, BS: int, K: int, E: int, seed: int = 0) -> np.ndarray:
    """Distinct ids per token: the first K of a random permutation of the E experts."""
    keys = np.random.default_rng(seed).random((W, BS, E))
    return np.argsort(keys, axis=2)[:, :, :K].astype(np.int32)


def test_file_routing_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    W, BS, K, L = 4, 16, 4, 4
    ids = _ids(W, BS, K, W * L, seed=5)
    # a hot expert on rank 0 (every token that lacks expert 3 takes it first): far from uniform
    ids[:, :, 0] = np.where((ids == 3).any(axis=2), ids[:, :, 0], 3)
    (tmp_path / "cap").mkdir()
    np.save(tmp_path / "cap" / "ids.npy", ids)
    path = _write(tmp_path, _doc({"kind": "file", "path": "cap/ids.npy", "seed": 9},
                                 op="dispatch_combine"))
    out = tmp_path / "o"
    assert main(["run", str(path), "--out", str(out), "--workers", "1"]) == 0
    capsys.readouterr()
    rep = json.loads((out / "report.json").read_text())
    sha = hashlib.sha256((tmp_path / "cap" / "ids.npy").read_bytes()).hexdigest()
    assert rep["scenario"]["workload"]["routing"] == {"kind": "file", "seed": 9,
                                                      "path": "cap/ids.npy", "sha256": sha}
    sc = load_scenario(path)
    res = simulate(sc)
    want = np.bincount(ids.ravel(), minlength=W * L).reshape(W, L)
    for d in range(W):
        assert res.ops[0].outputs[d]["expert_token_nums"].tolist() == want[d].tolist(), d
        assert np.array_equal(load_inputs(sc)[d]["expert_ids"], ids[d])
    # the seed still draws the token data: the same x as uniform routing with seed 9
    drawn = load_inputs(load_scenario(_write(tmp_path, _doc({"kind": "uniform", "seed": 9}),
                                             "u.yaml")))
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(load_inputs(sc), drawn,
                                                              strict=True))


def test_file_routing_with_shared_experts(tmp_path: Path) -> None:
    # W 5 with one shared expert on rank 0: the file names the 16 MoE experts only
    ids = _ids(5, 16, 4, 16, seed=1)
    np.save(tmp_path / "ids.npy", ids)
    sc = load_scenario(_write(tmp_path, _doc({"kind": "file", "path": "ids.npy"},
                                             ep_world_size=5, shared_experts=1,
                                             shared_expert_ranks=1)))
    assert recv_counts([r["expert_ids"] for r in load_inputs(sc)], 4, 1, 1)[1:] == \
        np.bincount(ids.ravel() // 4, minlength=4).tolist()
    bad = ids.copy()
    bad[4, 15, 3] = 16
    np.save(tmp_path / "ids.npy", bad)
    with pytest.raises(InputError, match=r"ids.npy\[4, 15, 3\] = 16 is out of range; "
                                         r"allowed: 0\.\.15 \(num_experts\)"):
        load_scenario(tmp_path / "r.yaml")


def _bad(kind: str, ids: np.ndarray, p: Path) -> str:
    """Write one bad file at p; return the message text expected after the file's name."""
    if kind == "range":
        ids[3, 7, 2] = 300
        np.save(p, ids)
        return "ids.npy[3, 7, 2] = 300 is out of range; allowed: 0..15 (num_experts)"
    if kind == "negative":
        ids[0, 0, 0] = -1
        ids[2, 0, 0] = 99
        np.save(p, ids)
        return "ids.npy[0, 0, 0] = -1 is out of range; allowed: 0..15"
    if kind == "duplicate":
        ids[1, 12, 3] = ids[1, 12, 1]
        ids[2, 1, 1] = ids[2, 1, 0]
        np.save(p, ids)
        return f"ids.npy[1, 12]: expert {ids[1, 12, 1]} appears twice"
    if kind == "triplicate":
        ids[0, 5, :3] = 7
        np.save(p, ids)
        return "ids.npy[0, 5]: expert 7 appears 3 times"
    if kind == "int64":
        np.save(p, ids.astype(np.int64))
        return "ids.npy holds int64 ids; allowed: int32"
    if kind == "float":
        np.save(p, ids.astype(np.float32))
        return "ids.npy holds float32 ids; allowed: int32"
    if kind == "shape":
        np.save(p, ids[:, :8])
        return "ids.npy has shape [4, 8, 4]; the workload needs [W, BS, K] = [4, 16, 4]"
    if kind == "flat":
        np.save(p, ids.reshape(-1))
        return "ids.npy has shape [256]; the workload needs [W, BS, K] = [4, 16, 4]"
    if kind == "pickled":
        np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        return "ids.npy holds Python objects (a pickled array), which npusim never loads"
    if kind == "text":
        p.write_text("0 1 2 3\n")
        return "ids.npy is not a .npy file"
    if kind == "npz":
        with open(p, "wb") as f:
            np.savez(f, ids=ids)
        return "ids.npy is a .npz archive"
    if kind == "truncated":
        np.save(p, ids)
        p.write_bytes(p.read_bytes()[:-3])
        return "ids.npy is truncated or corrupt"
    if kind == "header":
        p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 'i4',  \n")
        return "ids.npy has a malformed .npy header"
    if kind == "directory":
        p.mkdir()
        return "ids.npy is a directory"
    if kind == "missing":
        return f"ids.npy not found (looked for {p})"
    raise AssertionError(kind)


BAD = ["range", "negative", "duplicate", "triplicate", "int64", "float", "shape", "flat",
       "pickled", "text", "npz", "truncated", "header", "directory", "missing"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_routing_file_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          kind: str) -> None:
    text = _bad(kind, _ids(4, 16, 4, 16), tmp_path / "ids.npy")
    path = _write(tmp_path, _doc({"kind": "file", "path": "ids.npy"}))
    for cmd in (["lint", str(path)], ["run", str(path), "--out", str(tmp_path / "o")]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"npusim: error: {path}: workload.routing.path: {text}"), err
    assert not (tmp_path / "o").exists()


def test_file_routing_refuses_a_case_dir(tmp_path: Path) -> None:
    np.save(tmp_path / "ids.npy", _ids(4, 16, 4, 16))
    path = _write(tmp_path, _doc({"kind": "file", "path": "ids.npy"}))
    (tmp_path / "case").mkdir()
    with pytest.raises(InputError) as info:
        load_scenario(path, case_dir_override=tmp_path / "case")
    assert info.value.key == "--case-dir" and "routing.kind: file" in str(info.value)


def test_absolute_routing_path(tmp_path: Path) -> None:
    ids = _ids(4, 16, 4, 16)
    np.save(tmp_path / "abs.npy", ids)
    (tmp_path / "elsewhere").mkdir()
    sc = load_scenario(_write(tmp_path / "elsewhere",
                              _doc({"kind": "file", "path": str(tmp_path / "abs.npy")})))
    assert sc.to_dict()["workload"]["routing"]["path"] == str(tmp_path / "abs.npy")
    assert np.array_equal(np.stack(sc.workload.routing.file_ids()), ids)


ARRAYS = st.tuples(
    st.sampled_from([np.int32, np.int64, np.int16, np.uint32, np.float32, np.bool_]),
    st.sampled_from([(4, 16, 4), (4, 16, 3), (16, 4, 4), (4, 16), (0, 16, 4)]),
    st.integers(min_value=-2, max_value=18),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(spec=ARRAYS, seed=st.integers(0, 2**16))
def test_fuzzed_routing_files_load_or_fail_in_one_line(tmp_path: Path, spec: Any,
                                                        seed: int) -> None:
    dtype, shape, hi = spec
    rng = np.random.default_rng(seed)
    arr = rng.integers(-2, max(hi, -1) + 1, size=shape).astype(dtype)
    np.save(tmp_path / "f.npy", arr)
    path = _write(tmp_path, _doc({"kind": "file", "path": "f.npy"}))
    try:
        sc = load_scenario(path)
    except InputError as exc:
        assert str(exc).startswith(f"{path}: workload.routing.path: f.npy")
        assert "\n" not in str(exc)
        return
    got = np.stack(sc.workload.routing.file_ids())
    assert got.dtype == np.int32 and np.array_equal(got, arr)
    assert got.min() >= 0 and got.max() < 16
    assert all(len(set(t)) == 4 for t in got.reshape(-1, 4).tolist())


# --------------------------------------------------------------------------- shipped examples
@pytest.mark.parametrize("name", ["routing_lognormal", "routing_file"])
def test_shipped_routing_examples_lint(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / f"{name}.yaml"
    assert main(["lint", str(path)]) == 0, capsys.readouterr().err
    sc = load_scenario(path)
    kind = name.split("_")[1]
    assert sc.workload.routing.kind == kind
    if kind == "file":
        npy = EXAMPLES / sc.workload.routing.path
        assert sc.workload.routing.sha256 == hashlib.sha256(npy.read_bytes()).hexdigest()


def _report(sc: Any) -> str:
    rep = build_report(simulate(sc))
    rep["sim"].pop("wall_s", None)
    rep["scenario"].pop("source")
    return json.dumps(rep, sort_keys=True)


def test_reports_are_byte_identical_wherever_the_file_lives(tmp_path: Path) -> None:
    ids = _ids(4, 16, 4, 16, seed=2)
    reports = []
    for where in ("a", "b/c"):
        d = tmp_path / where
        d.mkdir(parents=True)
        np.save(d / "ids.npy", ids)
        reports.append(_report(load_scenario(_write(d, _doc({"kind": "file",
                                                              "path": "ids.npy"})))))
    assert reports[0] == reports[1]
    ln = _write(tmp_path, _doc({"kind": "lognormal", "sigma": 2.0, "seed": 6}), "ln.yaml")
    assert _report(load_scenario(ln)) == _report(load_scenario(ln))
