"""A base scenario that names its files by path, and a sweep of it kept in another folder
that holds decoys of the same names: where a point's paths resolve shows in its latency."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from npusim.cli import main
from npusim.kernels.cann_sample.casedir import generate_case
from npusim.workload.shape import MoeShape

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"op": "dispatch", "bs": 4, "h": 1024, "k": 2, "ep_world_size": 2,
         "experts_per_rank": 2}
# each path key of a scenario and the file it names in the tests' folders
FILES = {"hardware": "p.yaml", "workload.kernel": "k.py", "workload.routing.path": "r.npy",
         "data.case_dir": "case"}
# a name the base's folder lacks (the sweep's folder may hold a decoy of it)
MISSING = {key: f"gone{Path(name).suffix}" for key, name in FILES.items()}
FORMS = ("relative", "absolute", "missing", "absent")
DECOY_KERNEL = "raise RuntimeError('the decoy kernel file beside the sweep file')\n"


def write_files(folder: Path, real: bool, names: dict[str, str] = FILES) -> None:
    """The four files of FILES (or `names`) under folder: the base's own (real) or decoys
    that run differently (another preset, a kernel that cannot import, other routing)."""
    folder.mkdir(parents=True, exist_ok=True)
    preset = "ascend950" if real else "atlas_a2"
    shutil.copy(ROOT / "configs" / f"{preset}.yaml", folder / names["hardware"])
    kernel = folder / names["workload.kernel"]
    if real:
        shutil.copy(ROOT / "examples" / "kernels" / "toy_moe.py", kernel)
    else:
        kernel.write_text(DECOY_KERNEL)
    seed = 1 if real else 7
    w, bs, k, n = (SHAPE[x] for x in ("ep_world_size", "bs", "k", "experts_per_rank"))
    rng = np.random.default_rng(seed)
    ids = [[rng.choice(w * n, k, replace=False) for _ in range(bs)] for _ in range(w)]
    np.save(folder / names["workload.routing.path"], np.array(ids, np.int32))
    generate_case(folder / names["data.case_dir"], MoeShape(w, bs, SHAPE["h"], k, n),
                  "none", "none", seed=seed, routing="uniform")


def base_doc(folder: Path, forms: dict[str, str]) -> dict[str, Any]:
    """A base scenario setting each path key as forms says: the file by a path relative
    to the base's folder, by an absolute one, a name the base's folder lacks, or unset."""
    doc: dict[str, Any] = {"name": "base", "workload": dict(SHAPE)}
    for key, form in forms.items():
        if form == "absent":
            continue
        name = FILES[key]
        value = {"relative": name, "absolute": str(folder / name), "missing": MISSING[key]}[form]
        if key == "workload.routing.path":
            doc["workload"]["routing"] = {"kind": "file", "path": value}
        else:
            section, _, leaf = key.rpartition(".")
            (doc.setdefault(section, {}) if section else doc)[leaf] = value
    return doc


def sweep_of(base: Path, folder: Path) -> Path:
    """A one-point sweep file in folder whose base is `base`, named relative to it."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "s.yaml"
    rel = Path("..") / base.parent.name / base.name
    p.write_text(yaml.safe_dump({"name": "s", "base": str(rel),
                                 "axes": {"workload.bs": [SHAPE["bs"]]}}))
    return p


def run_latency(base: Path, out: Path) -> tuple[int, list[float]]:
    """`npusim run` of the base: its exit code and each op's latency from report.json."""
    code = main(["run", str(base), "--out", str(out), "--quiet", "--workers", "1"])
    if code:
        return code, []
    ops = json.loads((out / "report.json").read_text())["ops"]
    return code, [op["latency_us"] for op in ops]


def sweep_latency(sweep: Path, out: Path) -> tuple[int, list[float]]:
    """`npusim sweep`: its exit code and each row's latency from results.csv."""
    code = main(["sweep", str(sweep), "--out", str(out), "--quiet", "--workers", "1"])
    if code:
        return code, []
    with (out / "results.csv").open() as f:
        return code, [float(r["latency_us"]) for r in csv.DictReader(f)]
