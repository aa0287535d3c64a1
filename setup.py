"""Build glue that pyproject.toml cannot express: the repository keeps its presets and
scenarios at the top level (configs/, scenarios/), and the package finds them as
npusim._data.configs and npusim._data.scenarios (importlib.resources), so a wheel, an
sdist and an editable install all carry them. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

DATA = {"npusim._data.configs": "configs", "npusim._data.scenarios": "scenarios"}

setup(
    packages=find_packages(include=["npusim", "npusim.*"]) + list(DATA),
    package_dir=DATA,
    package_data={pkg: ["**/*.yaml", "**/*.yml", "**/*.csv", "**/*.npy", "**/*.bin",
                        "**/*.json"] for pkg in DATA},
)
