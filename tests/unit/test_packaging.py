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
