"""The seed harness of an agent program: it adds nothing, so the seed is the agent exactly as it is.

No contract text (the agent's own system prompt is kept as it sends it), no tips, no demonstrations, no harness
code; the library's H2 on every reply (calls validated against the tools the agent declares, bounded retries
with the validation error when a call is invalid). Training adds rules, tips, demonstrations, repairs and
regulation to it; each is decided on held-out tasks like for any harness.
"""

from __future__ import annotations

import json
from typing import Any

from ..harness.generic_seed import seed_manifest
from ..harness.manifest import HarnessVersion, version_from_files


def agent_seed_files(env_name: str, label: str = "") -> dict[str, str]:
    """Files of the seed harness for an agent program on environment `env_name`."""
    what = f" ({label})" if label else ""
    description = json.dumps(f"Seed harness of an agent program{what}: adds nothing to its requests; H2 validates "
                             "its tool calls.")
    manifest = seed_manifest('"agent-seed"', json.dumps(env_name), "native", description, max_tokens=512,
                             max_turns=30, regulate="",
                             generation_note="used only where the agent's request leaves a field out")
    return {"harness.toml": manifest, "contract.md": "", "skills.json": "[]\n", "demos.json": "[]\n"}


def agent_seed(env_name: str, label: str = "", env: Any = None) -> HarnessVersion:
    return version_from_files(agent_seed_files(env_name, label), origin=f"<agent seed for {env_name}>")
