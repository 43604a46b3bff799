"""Packaging metadata: what `pip install` reads from pyproject.toml."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_metadata_raises_no_setuptools_deprecation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """setuptools reads pyproject.toml without a deprecation warning (the license table is one)."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*tool.setuptools.* is still \\*beta\\*")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


def test_console_templates_and_static_files_are_package_data() -> None:
    """Every file the console serves is matched by package-data, so a built wheel (the Docker
    image's `pip install .`) carries it."""
    import tomllib
    from fnmatch import fnmatch

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["scheduler.console"]
    ui = ROOT / "scheduler" / "console"
    files = [
        p.relative_to(ui).as_posix() for d in ("templates", "static") for p in (ui / d).iterdir()
    ]
    assert files and all(any(fnmatch(f, g) for g in globs) for f in files), files
