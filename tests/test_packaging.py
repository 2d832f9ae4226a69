"""The built package holds every module: what pyproject finds is every folder of code."""

from __future__ import annotations

import sys
from pathlib import Path

import setuptools

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_of_code_is_a_package_the_build_finds() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert isinstance(config["packages"], dict), "find the packages: a list leaves new ones out"
    found = set(setuptools.find_packages(str(ROOT), **config["packages"]["find"]))
    folders = {str(p.parent.relative_to(ROOT)).replace("/", ".")
               for p in (ROOT / "pytest_distperf").rglob("*.py")}
    assert folders <= found, f"left out of the wheel: {sorted(folders - found)}"


def test_the_package_data_exists() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, names in config["package-data"].items():
        for name in names:
            assert (ROOT / package.replace(".", "/") / name).is_file(), (package, name)
