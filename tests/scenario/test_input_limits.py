"""Hostile input gets one line and exit 2: non-finite and huge numbers, YAML alias bombs,
huge strings, merge keys, duplicate keys in presets, a non-preset file as `hardware`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from npusim.cli import main
from npusim.errors import EXCERPT_CHARS, InputError, excerpt
from npusim.hw.config import CONFIG_DIR, load_hardware
from npusim.kernels import registry
from npusim.scenario import load_scenario
from npusim.scenario.schema import option_value

ROOT = Path(__file__).resolve().parents[2]
DISPATCH = ROOT / "scenarios" / "dispatch_bs8_mxfp8.yaml"  # ascend950
A3 = ROOT / "scenarios" / "dispatch_combine_a3_bs8.yaml"  # atlas_a3: has an sdma section
WORKLOAD = {"op": "dispatch", "bs": 8, "h": 1024, "k": 2, "ep_world_size": 2,
            "experts_per_rank": 2}


def _lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["lint", *argv])
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *says: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for s in says:
        assert s in err, err


@pytest.mark.parametrize("scenario,key,value", [
    (DISPATCH, "fabric.egress_gbps", ".nan"),  # was a 59-line traceback
    (DISPATCH, "chip.clock_ghz", ".nan"),  # the same
    (DISPATCH, "mte.put_latency_ns", ".nan"),  # was reported as a deadlock, exit 3
    (A3, "sdma.latency_ns", ".nan"),  # ran, exit 0, null in the report
    (DISPATCH, "chip.aiv_cores", ".inf"),  # OverflowError traceback
    (DISPATCH, "chip.aiv_cores", ".nan"),  # was blamed on `hardware`, not the key
    (DISPATCH, "ub.bytes", "-.inf"),
    (DISPATCH, "chip.clock_ghz", "1" + "0" * 400),  # float() of it overflows
])
def test_a_non_finite_or_huge_hardware_value_names_its_key(capsys, scenario, key, value):
    code, err = _lint(capsys, str(scenario), "--set", f"hardware_overrides.{key}={value}")
    _one_line(code, err, f"--set hardware_overrides.{key}:", "out of range")


def test_a_nan_in_a_preset_file_names_the_file_and_key(tmp_path):
    text = (CONFIG_DIR / "ascend950.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["hbm"]["bandwidth_gbps"]["value"] = math.nan
    p = tmp_path / "nan.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as e:
        load_hardware(str(p))
    assert e.value.source == str(p) and e.value.key == "hbm.bandwidth_gbps"
    assert "not a finite number" in e.value.message


def _float_options() -> list[tuple[str, str]]:
    return [(fam.name, o.name) for fam in map(registry.get, registry.BUILTIN)
            for o in fam.options if o.kind == "float"]


@pytest.mark.parametrize("family,name", _float_options())
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10 ** 400])
def test_every_float_option_of_every_family_refuses_non_finite(family, name, value):
    o = next(o for o in registry.get(family).options if o.name == name)
    with pytest.raises(InputError) as e:
        option_value("s.yaml", o, value)
    assert e.value.key == f"workload.{name}" and "out of range" in e.value.message


@pytest.mark.parametrize("sets", [
    ["workload.routing.kind=zipf", "workload.routing.s=.nan"],
    ["workload.routing.kind=lognormal", "workload.routing.sigma=.inf"],
    ["run.sim_time_limit_us=.nan"],
])
def test_a_non_finite_scenario_float_is_one_line(capsys, sets):
    argv = [str(DISPATCH)]
    for s in sets:
        argv += ["--set", s]
    code, err = _lint(capsys, *argv)
    _one_line(code, err, f"--set {sets[-1].split('=')[0]}:", "not a finite number")


def test_an_integer_past_pythons_digit_limit_is_one_line_from_set_and_file(capsys, tmp_path):
    digits = "7" * 5000  # int("7" * 5000) raises ValueError (sys.set_int_max_str_digits)
    code, err = _lint(capsys, str(DISPATCH), "--set", f"workload.routing.seed={digits}")
    _one_line(code, err, "--set workload.routing.seed:", "more than 4300 digits")
    assert len(err) < 400
    p = tmp_path / "s.yaml"
    p.write_text(f"name: s\nworkload: {{op: dispatch, bs: 8, h: 1024, k: 2, ep_world_size: "
                 f"2, experts_per_rank: 2, routing: {{seed: {digits}}}}}\n")
    code, err = _lint(capsys, str(p))
    _one_line(code, err, str(p), "more than 4300 digits")
    # hexadecimal has no digit limit: the integer loads, and is quoted as its size
    code, err = _lint(capsys, str(DISPATCH), "--set", "workload.routing.seed=0x" + "f" * 5000)
    _one_line(code, err, "--set workload.routing.seed:", "<an integer of about 6021 digits>")


def _bomb(levels: int) -> str:
    """A YAML list that stands for 9^levels items in a few hundred bytes of aliases."""
    rows = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return f"[{', '.join(rows)}]"


def _alias_bomb(levels: int) -> str:
    return ("name: bomb\nworkload: {op: dispatch, h: 1024, k: 2, ep_world_size: 2, "
            f"experts_per_rank: 2, bs: {_bomb(levels)}}}\n")


@pytest.mark.parametrize("levels", [3, 8])
def test_an_alias_bomb_never_expands_into_the_message(capsys, tmp_path, levels):
    p = tmp_path / "bomb.yaml"
    p.write_text(_alias_bomb(levels))
    assert len(p.read_bytes()) < 1000
    code, err = _lint(capsys, str(p))
    # 9^3 values load and are refused as a bs with a short quote; 9^8 are refused at load
    _one_line(code, err, str(p))
    assert len(err) < 400, err


def test_an_alias_bomb_through_set_is_refused_at_load(capsys):
    code, err = _lint(capsys, str(DISPATCH), "--set", f"workload.bs={_bomb(8)}")
    _one_line(code, err, "--set workload.bs:", "expands to more than")


def test_a_ten_megabyte_string_is_quoted_as_an_excerpt(capsys, tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(yaml.safe_dump({"name": "big", "workload": {**WORKLOAD, "dtype": "x" * 10**7}}))
    code, err = _lint(capsys, str(p))
    _one_line(code, err, "workload.dtype:", "'xxxx")
    assert len(err) < 400


def test_excerpt_is_short_whatever_the_value():
    nested: list = [1]
    for _ in range(200):  # 2^200 leaves if walked whole
        nested = [nested, nested]
    for value in (nested, "y" * 10**6, 16 ** 20000, {"k" * 10**5: [None] * 10**5}):
        assert len(excerpt(value)) <= EXCERPT_CHARS
    assert excerpt({"a": [True, None, 1.5, math.nan]}) == "{'a': [true, null, 1.5, .nan]}"


def test_a_merge_key_takes_the_mappings_own_keys_over_the_merged(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: m\nworkload:\n"
                 "  <<: {op: dispatch, bs: 8, h: 1024, k: 2, ep_world_size: 2, "
                 "experts_per_rank: 2}\n  bs: 16\n")
    assert load_scenario(p).workload.shape.BS == 16  # YAML merge: the override wins
    p.write_text(p.read_text() + "  bs: 32\n")  # a key given twice is still refused
    with pytest.raises(InputError, match="duplicate key 'bs'"):
        load_scenario(p)


def test_a_key_given_twice_in_a_preset_is_refused(tmp_path):
    text = (CONFIG_DIR / "ascend950.yaml").read_text()
    p = tmp_path / "dup.yaml"
    p.write_text(text + "\nname: twice\n")  # `name` is the preset's first key
    with pytest.raises(InputError) as e:
        load_hardware(str(p))
    assert e.value.source == str(p) and "duplicate key 'name'" in e.value.message


def test_a_hardware_file_that_is_no_preset_names_the_scenario_and_key(capsys, tmp_path):
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "s", "hardware": str(text), "workload": WORKLOAD}))
    code, err = _lint(capsys, str(p))
    _one_line(code, err, f"{p}: hardware: {text}: must be a YAML mapping")
