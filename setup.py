"""Build glue that pyproject.toml cannot express.

- Data: the repository keeps its presets and scenarios at the top level (configs/,
  scenarios/), and the package finds them as npusim._data.configs and
  npusim._data.scenarios (importlib.resources), so a wheel, an sdist and an editable
  install all carry them.
- The optional compiled core (npusim/engine/compiled.py): Cython builds of pure modules
  with the C types of the `.pxd` beside them. Optional: without Cython or a C compiler
  (or with NPUSIM_PURE_PYTHON=1) the install is pure Python and gives the same results.

Everything else is in pyproject.toml.
"""

import os

from setuptools import Extension, find_packages, setup

DATA = {"npusim._data.configs": "configs", "npusim._data.scenarios": "scenarios"}
# compiled module -> the pure module it is built from (types in <compiled>.pxd)
COMPILED = {"npusim.engine._env": "npusim/engine/env.py",
            "npusim.engine._flow": "npusim/engine/flow.py",
            "npusim.hw._pipe": "npusim/hw/pipe.py",
            "npusim.hw._ub": "npusim/hw/ub.py",
            "npusim.hw._memory": "npusim/hw/memory.py",
            "npusim.runtime._transfer": "npusim/runtime/transfer.py",
            # C only (no pure module: without it CPython's own arena allocator serves)
            "npusim.engine._arenas": "npusim/engine/_arenas.pyx"}


def data_packages() -> dict[str, str]:
    """Every folder under configs/ and scenarios/ as its own npusim._data package, so each is
    declared (setuptools installs only declared packages' files)."""
    found = {}
    for pkg, root in DATA.items():
        for folder, subdirs, _files in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "__")))
            rel = os.path.relpath(folder, root)
            found[pkg if rel == "." else f"{pkg}.{rel.replace(os.sep, '.')}"] = folder
    return found


def _types_edited() -> bool:
    """Whether a build's .pxd is newer than the C it was translated to. Cython tracks a
    module's source and the .pxd of the source's name, not a .pxd of another name
    (`_pipe.pxd` for `pipe.py`): without this, an edited .pxd would leave the old C, and
    the rebuilt module would run without the edited types (or, for a build that cimports
    another's types, disagree with it on their layout)."""
    for name, src in COMPILED.items():
        pxd = os.path.join(os.path.dirname(src), name.rpartition(".")[2] + ".pxd")
        c_file = os.path.join("build", "cython", os.path.splitext(src)[0] + ".c")
        if (os.path.exists(c_file) and os.path.exists(pxd)
                and os.path.getmtime(pxd) > os.path.getmtime(c_file)):
            return True
    return False


def extensions() -> list:
    if os.environ.get("NPUSIM_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    exts = cythonize([Extension(name, [src]) for name, src in COMPILED.items()],
                     build_dir="build/cython", quiet=True, force=_types_edited(),
                     compiler_directives={"language_level": 3, "annotation_typing": False,
                                          "binding": False})
    for ext in exts:
        ext.optional = True  # no C compiler: a warning, and the pure modules serve
    return exts


DATA_FILES = ["*.yaml", "*.yml", "*.csv", "*.npy", "*.bin", "*.json"]

setup(
    packages=find_packages(include=["npusim", "npusim.*"]) + list(data_packages()),
    package_dir=data_packages(),
    package_data={**{pkg: DATA_FILES for pkg in data_packages()},
                  "npusim.engine": ["*.pxd", "*.pyx"], "npusim.hw": ["*.pxd"],
                  "npusim.runtime": ["*.pxd"]},
    ext_modules=extensions(),
)
