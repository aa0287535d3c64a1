"""What ships with npusim: the preset folder, the target tables and the scenarios by name.

The files live at the repository's top level (configs/, scenarios/) and are installed as
the packages npusim._data.configs and npusim._data.scenarios (setup.py), so they are found
through importlib.resources from any working directory, in a wheel, an sdist or an
editable install alike. They must be plain files (not a zip): a shipped scenario names
other files relative to its own folder (a sweep's base, a hardware YAML, a case directory).

A shipped scenario's name is its path under scenarios/ without `.yaml`
(`dispatch_bs8_mxfp8`, `examples/link_bound`, `sweeps/bs_w8_mxfp8`); a bare file name
(`link_bound`) also works when only one shipped file has it.
"""

from __future__ import annotations

import errno
from importlib import resources
from pathlib import Path

import yaml

from npusim.errors import InputError
from npusim.paths import user_path
from npusim.suggest import did_you_mean

SWEEPS = "sweeps"  # the scenarios/ subfolder that holds sweep files (npusim sweep)


def _root(kind: str) -> Path:
    package = f"npusim._data.{kind}"
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        # npusim imported from a source checkout that was installed without -e (tests
        # run from the clone): the data sits beside the package, as in the repository
        checkout = Path(__file__).resolve().parent.parent / kind
        if (checkout / "__init__.py").is_file():
            return checkout
        raise FileNotFoundError(
            errno.ENOENT, "npusim's presets and scenarios are not installed with the package; "
            "reinstall it (`pip install -e .` in a clone, or `pip install` the wheel)",
            package) from None
    if not isinstance(root, Path):
        raise FileNotFoundError(
            errno.ENOENT, "npusim's data must be installed as files, not inside a zip", package)
    return root


def configs_dir() -> Path:
    """The hardware presets (`<name>.yaml`)."""
    return _root("configs")


def targets_dir() -> Path:
    """The published measurement tables (`<preset>.csv`, npusim validate / calibrate)."""
    return _root("configs") / "targets"


def scenarios_dir() -> Path:
    """The shipped scenarios (examples/ and sweeps/ below it)."""
    return _root("scenarios")


def _shipped(sweeps: bool) -> dict[str, Path]:
    root = scenarios_dir()
    names = {p.relative_to(root).with_suffix("").as_posix(): p for p in root.rglob("*.yaml")}
    return {n: names[n] for n in sorted(names, key=lambda n: (n.count("/"), n))
            if n.startswith(f"{SWEEPS}/") == sweeps}


def scenarios() -> dict[str, Path]:
    """Shipped scenarios (npusim run NAME), name -> file, in name order."""
    return _shipped(sweeps=False)


def sweeps() -> dict[str, Path]:
    """Shipped sweeps (npusim sweep NAME), name -> file, in name order."""
    return _shipped(sweeps=True)


def description(path: Path) -> str:
    """The first line of a shipped file's `description` ('' without one)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "(unreadable)"
    text = doc.get("description") if isinstance(doc, dict) else None
    return str(text).strip().splitlines()[0] if text else ""


def _lookup(arg: str, table: dict[str, Path]) -> Path | None:
    name = arg.removeprefix("scenarios/").removesuffix(".yaml")
    if name in table:
        return table[name]
    by_stem = [p for n, p in table.items() if n.rsplit("/", 1)[-1] == name]
    return by_stem[0] if len(by_stem) == 1 else None


def resolve(arg: str, sweep: bool = False) -> str:
    """A command-line SCENARIO (or SWEEP): an existing path as given, else the shipped file
    of that name; neither is an InputError with a did-you-mean and where to list them."""
    if not arg or "\x00" in arg or user_path(arg).exists():
        return arg  # the loader reports a bad path; an existing one is used as it is
    kind, command = ("sweep", "sweep") if sweep else ("scenario", "run")
    table, other = (sweeps(), scenarios()) if sweep else (scenarios(), sweeps())
    found = _lookup(arg, table)
    if found is not None:
        return str(found)
    if _lookup(arg, other) is not None:
        other_kind, other_command = ("scenario", "run") if sweep else ("sweep", "sweep")
        raise InputError(arg, None, f"is a shipped {other_kind}, not a {kind}; "
                         f"use `npusim {other_command} {arg}`")
    stems = [n.rsplit("/", 1)[-1] for n in table]
    hint = did_you_mean(arg.removeprefix("scenarios/").removesuffix(".yaml"), [*table, *stems])
    raise InputError(arg, None, f"no such file and no shipped {kind} of that name{hint}; "
                     f"list the shipped ones with `npusim scenarios`, then `npusim {command} "
                     "NAME`")
