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
            "npusim.hw._pipe": "npusim/hw/pipe.py"}


def extensions() -> list:
    if os.environ.get("NPUSIM_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    exts = cythonize([Extension(name, [src]) for name, src in COMPILED.items()],
                     build_dir="build/cython", quiet=True,
                     compiler_directives={"language_level": 3, "annotation_typing": False,
                                          "binding": False})
    for ext in exts:
        ext.optional = True  # no C compiler: a warning, and the pure modules serve
    return exts


setup(
    packages=find_packages(include=["npusim", "npusim.*"]) + list(DATA),
    package_dir=DATA,
    package_data={**{pkg: ["**/*.yaml", "**/*.yml", "**/*.csv", "**/*.npy", "**/*.bin",
                           "**/*.json"] for pkg in DATA},
                  "npusim.engine": ["*.pxd"], "npusim.hw": ["*.pxd"]},
    ext_modules=extensions(),
)
