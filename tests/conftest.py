"""Shared fixtures: task data from ../shared/data (or $ECDYSIS_DATA_DIR), temp caches, local models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ecdysis.models import local_models

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("ECDYSIS_DATA_DIR", ROOT.parent / "shared" / "data"))
    assert (path / "gsm8k" / "test.jsonl").exists(), f"task data not found in {path}"
    return path


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """SmolLM2-135M, pulled by `make test` before pytest runs."""
    return local_models.resolve_verified("smollm2-135m")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_CACHE", str(tmp_path / "cache.sqlite"))
