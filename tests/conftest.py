"""Shared fixtures: task data from ../shared/data (or $ECDYSIS_DATA_DIR), temp caches, local models."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def llama_server(smollm_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm_path), "--model_alias", "smol",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{base}/models", timeout=2).read()
            break
        except OSError:
            assert proc.poll() is None, "llama.cpp server exited during start-up"
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("llama.cpp server did not start within 90s")
    yield proc, base
    proc.kill()
    proc.wait()
