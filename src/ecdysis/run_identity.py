"""A run's identity: the config as far as it decides a run's results, as canonical JSON (what run ids hash).

Execution-only and location-only settings are left out, files stand for a hash of their content, local model
paths for their file names: the same config gives the same run id wherever the project folder lives, and a
changed harness, task file or agent script gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .config import EXECUTION_ONLY, EXTERNAL_AGENT_KEYS, AgentSection, Config

# Settings that say where things are, not what a run computes: kept out of run ids (with the execution-only
# ones), so a run resumes after its project folder moves.
LOCATION_ONLY: dict[str, set[str]] = {"run": {"run_dir", *EXECUTION_ONLY}, "env": {"data_dir", "plugin_path"},
                                      "cache": {"path"}, "agent": {"cwd"}}


def _content_hash(path: Path) -> str:
    """sha256 (16 hex) of a file, or of a directory's files (relative names and bytes; hidden and caches skipped)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(path).parts))
    for file in files:
        h.update(file.relative_to(path).as_posix().encode() if file != path else b"")
        h.update(b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _portable(value: Any) -> Any:
    """An option value with absolute file paths replaced by their content hash (`file.py:function` keeps the
    function), directories by their name; anything else unchanged."""
    if isinstance(value, list):
        return [_portable(v) for v in value]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    head, sep, tail = value.rpartition(":") if ".py:" in value else (value, "", "")
    path = Path(head)
    if path.is_file():
        return f"sha256:{_content_hash(path)}{sep}{tail}"
    return f"{path.name}{sep}{tail}"


def _portable_ref(ref: str) -> str:
    """A model reference with a local GGUF path reduced to its file name (`local:/x/m.gguf` -> `local:m.gguf`)."""
    return f"local:{Path(ref[6:]).name}" if ref.startswith("local:/") else ref


def program_fingerprint(agent: AgentSection) -> list[str]:
    """The command (or callable) with every argument naming a file under its folder replaced by that file's
    content hash, so editing the agent's script starts new runs instead of resuming stale ones; plus
    `agent.version` for code the command does not name."""
    cwd = Path(agent.cwd or Path.cwd())
    parts = list(agent.command) or [agent.callable]
    out = []
    for part in parts:
        name = part.split(":", 1)[0] if part == agent.callable else part
        candidates = [cwd / name, cwd / (name.replace(".", "/") + ".py")] if part == agent.callable else [cwd / name]
        found = next((p for p in candidates if p.is_file()), None)
        out.append(f"{part}@sha256:{hashlib.sha256(found.read_bytes()).hexdigest()[:16]}" if found else part)
    return out + ([f"version:{agent.version}"] if agent.version else [])


def identity_json(config: Config) -> str:
    """The config as far as it decides a run's results, as canonical JSON (what run ids hash): execution-only
    and location-only settings left out, the harness directory and files named in `env.options` standing for
    a hash of their content, local model paths for their file names. Moving the project folder keeps it."""
    data = config.model_dump(mode="json", exclude=LOCATION_ONLY)  # type: ignore[arg-type]
    if config.agent.harness is not None:
        harness = Path(config.agent.harness)
        data["agent"]["harness"] = f"sha256:{_content_hash(harness)}" if harness.exists() else harness.name
    data["agent"]["model"] = _portable_ref(config.agent.model)
    if config.agent.external:  # the program's files (a script the command names) stand for their content
        data["agent"]["command"] = program_fingerprint(config.agent)
    else:  # the library's own loop: the same identity as before agent programs existed
        for key in EXTERNAL_AGENT_KEYS:
            data["agent"].pop(key, None)
    data["user"]["model"] = _portable_ref(config.user.model)
    for role in ("analyst", "critic", "engineer", "moderator", "implementer"):
        data["roles"][role] = _portable_ref(getattr(config.roles, role))
    data["model_settings"] = {_portable_ref(k): v for k, v in data["model_settings"].items()}
    data["env"]["options"] = _portable(data["env"]["options"])
    return json.dumps(data, sort_keys=True, default=str)
