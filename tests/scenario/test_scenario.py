"""Scenario loading: defaults, every validation rule, and fuzzed invalid documents."""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.errors import InputError
from npusim.scenario import (
    Scenario,
    load_scenario,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
PUBLISHED = [
    "dispatch_bs8_none",
    "dispatch_bs8_mxfp8",
    "dispatch_bs256_none",
    "dispatch_bs256_mxfp8",
    "combine_bs8_none",
    "combine_bs8_int8",
    "combine_bs256_none",
    "combine_bs256_int8",
]

MINIMAL: dict[str, Any] = {
    "name": "t",
    "workload": {
        "op": "dispatch",
        "bs": 8,
        "h": 7168,
        "k": 8,
        "ep_world_size": 8,
        "experts_per_rank": 4,
    },
}


def write(dir_: Path, doc: Any, name: str = "s.yaml") -> Path:
    p = dir_ / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return p


def with_(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of base (MINIMAL) with the dotted key set; value DELETE removes it."""
    doc = copy.deepcopy(base or MINIMAL)
    node = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if value is DELETE:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value
    return doc


DELETE = object()


# ---------------------------------------------------------------- valid


def test_minimal_scenario_gets_documented_defaults(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, MINIMAL))
    assert isinstance(sc, Scenario)
    w = sc.workload
    s = w.shape
    assert (w.op, s.BS, s.H, s.K, s.W, s.L) == ("dispatch", 8, 7168, 8, 8, 4)
    assert s.E == 32 and w.ops == ("dispatch",) and s.A == 8 * 8 * 4
    assert (w.dtype, w.dispatch_quant, w.combine_quant) == ("float16", "none", "none")
    assert w.mxfp8_saturate is False and w.combine_recip is True and w.timing_only is False
    assert w.expert_token_nums_type == "count" and (s.S, s.S_r) == (0, 0)
    assert (w.routing.kind, w.routing.seed, w.routing.s) == ("balanced", 0, None)
    assert sc.hardware_ref == "ascend950" and sc.hardware.name == "ascend950"
    assert sc.hardware_overrides == {} and sc.data.case_dir is None
    assert sc.run.sim_time_limit_us == 100000.0 and sc.description == ""
    d = sc.to_dict()
    assert d["workload"]["routing"] == {"kind": "balanced", "seed": 0}
    assert d["hardware"] == "ascend950" and d["run"]["sim_time_limit_us"] == 100000.0
    assert set(d) >= {"name", "hardware", "hardware_overrides", "workload", "data", "run"}


def test_scenario_is_frozen(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, MINIMAL))
    with pytest.raises(AttributeError):
        sc.name = "x"  # type: ignore[misc]


@pytest.mark.parametrize("name", PUBLISHED + ["dispatch_bs256_int8", "dispatch_combine_bs8"])
def test_shipped_scenarios_load(name: str) -> None:
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    w = sc.workload
    assert sc.name == name and sc.description
    s = w.shape
    assert (s.H, s.K, s.W, s.L, w.dtype) == (7168, 8, 8, 4, "float16")
    assert (w.routing.kind, w.routing.seed) == ("balanced", 0)
    assert sc.hardware.name == "ascend950"


def test_dispatch_combine_scenario_quant_modes() -> None:
    w = load_scenario(SCENARIOS / "dispatch_combine_bs8.yaml").workload
    assert w.ops == ("dispatch", "combine")
    assert (w.dispatch_quant, w.combine_quant) == ("mxfp8", "int8")


def test_zipf_default_exponent(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, with_("workload.routing", {"kind": "zipf", "seed": 3})))
    assert sc.workload.routing.s == 1.2 and sc.to_dict()["workload"]["routing"]["s"] == 1.2


def test_overrides_dotted_and_nested(tmp_path: Path) -> None:
    doc = with_("hardware_overrides", {"fabric.egress_gbps": 500, "chip": {"aiv_cores": 32}})
    sc = load_scenario(write(tmp_path, doc))
    assert sc.hardware.fabric.egress_gbps == 500.0 and sc.hardware.chip.aiv_cores == 32
    assert sc.to_dict()["hardware_overrides"] == {"chip.aiv_cores": 32, "fabric.egress_gbps": 500}


def test_hardware_path_relative_to_scenario(tmp_path: Path) -> None:
    (tmp_path / "hw").mkdir()
    shutil.copy(ROOT / "configs" / "atlas_a3.yaml", tmp_path / "hw" / "mine.yaml")
    sc = load_scenario(write(tmp_path, with_("hardware", "hw/mine.yaml")))
    assert sc.hardware.chip.aiv_cores == 48


def make_case(root: Path, w: int = 8, bs: int = 8, h: int = 7168, k: int = 8) -> Path:
    for r in range(w):
        d = root / "input" / f"chip_{r}"
        d.mkdir(parents=True)
        (d / f"x_{r}.bin").write_bytes(b"\0" * (bs * h * 2))
        (d / f"expert_ids_{r}.bin").write_bytes(b"\0" * (bs * k * 4))
        (d / f"expert_scales_{r}.bin").write_bytes(b"\0" * (bs * k * 4))
        (d / f"expand_x_{r}.bin").write_bytes(b"")
    return root


def test_case_dir_relative_to_scenario_folder(tmp_path: Path) -> None:
    make_case(tmp_path / "case")
    sc = load_scenario(write(tmp_path, with_("data.case_dir", "case")))
    assert sc.data.case_dir == (tmp_path / "case").resolve()


def test_case_dir_override(tmp_path: Path) -> None:
    case = make_case(tmp_path / "elsewhere")
    sc = load_scenario(write(tmp_path, MINIMAL), case_dir_override=str(case))
    assert sc.data.case_dir == case.resolve()
    with pytest.raises(InputError, match="--case-dir"):
        load_scenario(write(tmp_path, MINIMAL), case_dir_override=str(tmp_path / "missing"))


# ---------------------------------------------------------------- broken, table driven

W = "workload."
BROKEN: list[tuple[str, Any, str, str]] = [
    # (id, document or YAML text, dotted key in the message, text in the message)
    ("unknown-top", with_("worklaod", {}), "worklaod", "did you mean 'workload'"),
    ("unknown-wl", with_(W + "bss", 8), W + "bss", "did you mean 'bs'"),
    ("missing-name", with_("name", DELETE), "name", "missing"),
    ("missing-bs", with_(W + "bs", DELETE), W + "bs", "missing"),
    ("missing-workload", with_("workload", DELETE), "workload", "missing"),
    ("workload-list", with_("workload", [1, 2]), "workload", "mapping"),
    ("bool-bs", with_(W + "bs", True), W + "bs", "integer"),
    ("float-bs", with_(W + "bs", 8.5), W + "bs", "integer"),
    ("str-bs", with_(W + "bs", "8"), W + "bs", "integer"),
    ("bs-0", with_(W + "bs", 0), W + "bs", "1..512"),
    ("bs-513", with_(W + "bs", 513), W + "bs", "1..512"),
    ("h-low", with_(W + "h", 512), W + "h", "1024..8192"),
    ("h-high", with_(W + "h", 8224), W + "h", "1024..8192"),
    ("h-mult", with_(W + "h", 1040), W + "h", "multiple of 32"),
    ("k-0", with_(W + "k", 0), W + "k", "1..16"),
    ("k-17", with_(W + "k", 17), W + "k", "1..16"),
    ("w-1", with_(W + "ep_world_size", 1), W + "ep_world_size", "2..768"),
    ("w-769", with_(W + "ep_world_size", 769), W + "ep_world_size", "2..768"),
    ("l-0", with_(W + "experts_per_rank", 0), W + "experts_per_rank", "1..512"),
    (
        "e-1025",
        with_(W + "experts_per_rank", 4, with_(W + "ep_world_size", 512)),
        W + "experts_per_rank",
        "at most 1024",
    ),
    (
        "k-gt-e",
        with_(W + "k", 3, with_(W + "experts_per_rank", 1, with_(W + "ep_world_size", 2))),
        W + "k",
        "k <= 2",
    ),
    ("op", with_(W + "op", "dispach"), W + "op", "did you mean 'dispatch'"),
    ("op-null", with_(W + "op", None), W + "op", "dispatch, combine, dispatch_combine"),
    ("dtype", with_(W + "dtype", "fp16"), W + "dtype", "float16, bfloat16"),
    ("dq", with_(W + "dispatch_quant", "mxfp"), W + "dispatch_quant", "none, int8, mxfp8"),
    ("cq", with_(W + "combine_quant", "mxfp8"), W + "combine_quant", "none, int8"),
    ("sat-int", with_(W + "mxfp8_saturate", 1), W + "mxfp8_saturate", "true or false"),
    ("recip-str", with_(W + "combine_recip", "yes"), W + "combine_recip", "true or false"),
    ("etn", with_(W + "expert_token_nums_type", 0), W + "expert_token_nums_type", "count"),
    ("shared-5", with_(W + "shared_experts", 5), W + "shared_experts", "0..4"),
    ("shared-no-ranks", with_(W + "shared_experts", 1), W + "shared_expert_ranks",
     "shared experts need ranks"),
    ("timing-str", with_(W + "timing_only", "no"), W + "timing_only", "true or false"),
    ("routing-kind", with_(W + "routing", {"kind": "zipfian"}), W + "routing.kind", "zipf"),
    ("routing-key", with_(W + "routing", {"sede": 1}), W + "routing.sede", "'seed'"),
    ("routing-seed", with_(W + "routing", {"seed": -1}), W + "routing.seed", "0.."),
    ("routing-s0", with_(W + "routing", {"kind": "zipf", "s": 0}), W + "routing.s", "(0"),
    ("routing-s-bal", with_(W + "routing", {"s": 1.5}), W + "routing.s", "zipf"),
    ("routing-list", with_(W + "routing", ["balanced"]), W + "routing", "mapping"),
    ("limit-0", with_("run.sim_time_limit_us", 0), "run.sim_time_limit_us", "(0"),
    ("limit-nan", with_("run.sim_time_limit_us", float("nan")), "run.sim_time_limit_us", "range"),
    ("limit-inf", with_("run.sim_time_limit_us", float("inf")), "run.sim_time_limit_us", "range"),
    ("limit-str", with_("run.sim_time_limit_us", "1ms"), "run.sim_time_limit_us", "number"),
    ("run-key", with_("run.limit", 5), "run.limit", "sim_time_limit_us"),
    ("name-path", with_("name", "../evil"), "name", "folder name"),
    ("name-int", with_("name", 5), "name", "string"),
    ("desc-int", with_("description", 5), "description", "string"),
    ("preset", with_("hardware", "ascend960"), "hardware", "did you mean 'ascend950'"),
    ("preset-file", with_("hardware", "nowhere.yaml"), "hardware", "not found"),
    ("preset-int", with_("hardware", 950), "hardware", "string"),
    (
        "ovr-unknown",
        with_("hardware_overrides", {"fabric.egres_gbps": 1}),
        "hardware_overrides.fabric.egres_gbps",
        "did you mean 'fabric.egress_gbps'",
    ),
    (
        "ovr-type",
        with_("hardware_overrides", {"fabric.egress_gbps": "fast"}),
        "hardware_overrides.fabric.egress_gbps",
        "number",
    ),
    (
        "ovr-range",
        with_("hardware_overrides", {"chip.aiv_cores": 0}),
        "hardware_overrides.chip.aiv_cores",
        "range",
    ),
    (
        "one-core",
        with_("hardware_overrides", {"chip.aiv_cores": 1}),
        "hardware_overrides.chip.aiv_cores",
        "at least 2 AIV cores",
    ),
    (
        "ovr-section",
        with_("hardware_overrides", {"fabric": 5}),
        "hardware_overrides.fabric",
        "section",
    ),
    ("ovr-list", with_("hardware_overrides", [1]), "hardware_overrides", "mapping"),
    (
        "window-small",
        with_("hardware_overrides", {"window.bytes": 256 << 20}),
        "hardware_overrides.window.bytes",
        "layout",
    ),
    (
        "window-full",
        with_(
            W + "bs",
            512,
            with_(W + "h", 8192, with_(W + "ep_world_size", 256, with_(W + "k", 8))),
        ),
        W + "bs",
        "window too small",
    ),
    ("case-missing", with_("data.case_dir", "no/such/dir"), "data.case_dir", "not a directory"),
    ("case-int", with_("data.case_dir", 3), "data.case_dir", "string"),
    ("data-key", with_("data.case", "x"), "data.case", "did you mean 'case_dir'"),
]


@pytest.mark.parametrize(
    ("doc", "key", "text"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_broken_scenario_names_file_and_key(tmp_path: Path, doc: Any, key: str, text: str) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(InputError) as info:
        load_scenario(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    assert f": {key}: " in msg, msg
    assert text in msg, msg
    assert "\n" not in msg


RAW_BROKEN = [
    ("malformed", "name: [unclosed\n", "malformed YAML at line"),
    ("empty", "", "got empty"),
    ("list-doc", "- a\n- b\n", "got a list"),
    ("scalar-doc", "hello\n", "got a str"),
    ("dup-key", "name: a\nname: b\n", "duplicate key 'name'"),
    ("bad-tag", "name: !!python/object:os.system x\n", "malformed YAML"),
    ("bad-int-tag", "name: !!int abc\n", "malformed YAML"),
    ("tab", "name: a\n\tworkload: {}\n", "malformed YAML"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [r[1:] for r in RAW_BROKEN], ids=[r[0] for r in RAW_BROKEN]
)
def test_unreadable_yaml(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: ") and fragment in str(info.value)


def test_not_utf8_missing_and_directory(tmp_path: Path) -> None:
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    for path, fragment in [
        (bad, "UTF-8"),
        (tmp_path / "missing.yaml", "cannot read"),
        (tmp_path, "directory"),
    ]:
        with pytest.raises(InputError, match=fragment) as info:
            load_scenario(path)
        assert str(info.value).startswith(str(path))


def test_case_dir_shape_checks(tmp_path: Path) -> None:
    make_case(tmp_path / "w4", w=4)
    make_case(tmp_path / "bs16", bs=16)
    (tmp_path / "noinput").mkdir()
    cases = [
        ("w4", "4 input/chip_* folders"),
        ("bs16", "_0.bin has"),
        ("noinput", "no input/ folder"),
    ]
    for case, fragment in cases:
        path = write(tmp_path, with_("data.case_dir", case))
        with pytest.raises(InputError, match=re.escape(fragment)) as info:
            load_scenario(path)
        assert f"{path}: data.case_dir: " in str(info.value)


def test_case_dir_with_timing_only(tmp_path: Path) -> None:
    make_case(tmp_path / "case")
    doc = with_("data.case_dir", "case", with_(W + "timing_only", True))
    with pytest.raises(InputError, match="timing_only"):
        load_scenario(write(tmp_path, doc))


# ---------------------------------------------------------------- fuzz

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
KEYS = [
    "name",
    "description",
    "hardware",
    "hardware_overrides",
    "workload",
    "data",
    "run",
    "data.case_dir",
    "run.sim_time_limit_us",
    "hardware_overrides.fabric.egress_gbps",
    "workload.routing",
    "workload.routing.kind",
    "workload.routing.seed",
    "workload.routing.s",
    "workload.routing.sigma",
    "workload.routing.path",
] + [
    f"workload.{k}"
    for k in (
        "op bs h k ep_world_size experts_per_rank dtype dispatch_quant combine_quant "
        "mxfp8_saturate combine_recip expert_token_nums_type shared_experts shared_expert_ranks "
        "timing_only"
    ).split()
]


def _load_text(text: str) -> Scenario | None:
    """Load from a fresh temp dir; returns None on InputError, re-raises anything else."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.yaml"
        path.write_text(text)
        try:
            return load_scenario(path)
        except InputError as exc:
            assert str(exc).startswith(str(path))
            return None


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(key=st.sampled_from(KEYS), value=JUNK)
def test_fuzz_one_bad_value(key: str, value: Any) -> None:
    _load_text(yaml.safe_dump(with_(key, value)))


@FUZZ
@given(extra=st.text(min_size=1, max_size=10).filter(lambda s: s not in MINIMAL), value=JUNK)
def test_fuzz_unknown_top_key_is_rejected(extra: str, value: Any) -> None:
    doc = dict(MINIMAL)
    if extra in ("description", "hardware", "hardware_overrides", "data", "run"):
        return
    doc[extra] = value
    assert _load_text(yaml.safe_dump(doc)) is None


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzz_random_text(text: str) -> None:
    _load_text(text)


DOCS = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(KEYS + ["op", "bs", "x"]), children, max_size=4),
    ),
    max_leaves=12,
)


@FUZZ
@given(doc=DOCS)
def test_fuzz_random_documents(doc: Any) -> None:
    assert _load_text(yaml.safe_dump(doc)) is None


@pytest.mark.parametrize("key", ["hardware", "data.case_dir", "workload.kernel"])
def test_a_tilde_of_no_user_is_a_literal_path_not_a_traceback(tmp_path: Path, key: str) -> None:
    """`~0` names no user here (hypothesis found it): like a shell, npusim keeps the word as
    written, so it fails as a missing file on its key."""
    doc = with_(key, "~nosuchuser_npusim/x.yaml" if key != "data.case_dir"
                else "~nosuchuser_npusim/case")
    with pytest.raises(InputError) as info:
        load_scenario(write(tmp_path, doc))
    assert info.value.key in (key, "workload.kernel"), info.value
    assert "~nosuchuser_npusim" in info.value.message
