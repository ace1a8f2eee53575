"""A working seed harness written from what an environment declares (its tools and instructions).

Used by `ecdysis init DIR --env REF` and as the default harness of environments without a built-in seed.
Schema tools get native function calling and the library's default H2 (`native_realize`); H4 flags repeated
identical calls. `seed_manifest` writes the manifest of this seed and of an agent program's (`external.seed`).
"""

from __future__ import annotations

import json
from typing import Any

from .manifest import HarnessVersion, version_from_files

REGULATE = '''"""H4: flag a repeated identical tool call; stop a loop of three."""

from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    repeats = sum(1 for action, _ in state.history if action.key() == state.action.key())
    if repeats >= 2:
        return Verdict(stop=True, reason="the same call was repeated three times")
    if repeats == 1:
        return Verdict(annotation="(You already made this exact call. Use its result or do something else.)")
    return Verdict()
'''

NATIVE_RULES = """Use the tools through function calls; never write a call as text. Call one tool at a time and
read its result before the next step."""
PARALLEL_RULES = """Use the tools through function calls; never write a call as text. When the request needs
several calls, make them all in the same reply."""
CONVERSATION_RULES = "Talk to the user in short plain sentences; ask for what you need, one thing at a time."
FINAL_RULES = "When the task is done, reply in one short sentence without calling a tool."


def generic_seed_files(env_name: str, env: Any) -> dict[str, str]:
    """Seed harness files for `env` (an Environment; optional attributes: tools, instructions,
    tool_calling, conversational, max_turns, task_tools (each task brings its own tools), parallel_calls
    (several calls in one reply are expected), ends_itself (episodes end after their calls: no final reply)).
    With task-level tools the contract does not list tools (they reach the model through the function-calling
    API), so the system prompt stays the same for every task."""
    tools = tuple(getattr(env, "tools", ()) or ())
    task_tools = bool(getattr(env, "task_tools", False))
    parallel = bool(getattr(env, "parallel_calls", False))
    native = getattr(env, "tool_calling", "native" if task_tools or any(t.parameters is not None for t in tools)
                     else "text")
    conversational = bool(getattr(env, "conversational", False))
    instructions = (getattr(env, "instructions", "") or "").strip()
    parts = [instructions or "You are an agent that completes the task below."]
    if tools and not task_tools:
        parts.append("Tools:\n{tools}")
    if tools or task_tools:
        parts.append((PARALLEL_RULES if parallel else NATIVE_RULES) if native == "native"
                     else "Use the tools as described above.")
    if conversational:
        parts.append(CONVERSATION_RULES)
    elif not getattr(env, "ends_itself", False):  # an episode that ends after its calls has no final reply
        parts.append(FINAL_RULES)
    max_turns = int(getattr(env, "max_turns", 30 if conversational else 10))
    # json.dumps: a TOML basic string (quotes and backslashes escaped; a plain name is written as before)
    manifest = seed_manifest(json.dumps(f'{env_name.replace(":", "-")}-seed'), json.dumps(env_name), native,
                             '"Seed harness written by `ecdysis init` from the environment\'s tools and instructions."',
                             max_tokens=300, max_turns=max_turns, regulate="regulate.py")
    return {"harness.toml": manifest, "contract.md": "\n\n".join(parts) + "\n", "skills.json": "[]\n",
            "demos.json": "[]\n", "regulate.py": REGULATE}


def seed_manifest(name: str, env: str, tool_calling: str, description: str, max_tokens: int, max_turns: int,
                  regulate: str, generation_note: str = "") -> str:
    """The `harness.toml` of a written seed (this one, `external.seed`'s): layered, at most 2 rejections and 2
    skills, no action file. `name`, `env` and `description` are TOML strings as written (quoted); the text is
    part of the seed's version id, so it must not change for the same arguments."""
    note = f"# {generation_note}\n" if generation_note else ""
    return f'''name = {name}
env = {env}
mode = "layered"
tool_calling = "{tool_calling}"
description = {description}

[generation]
{note}temperature = 0.0
max_tokens = {max_tokens}

[budget]
max_turns = {max_turns}
max_rejections = 2
top_k_skills = 2

[files]
contract = "contract.md"
skills = "skills.json"
demos = "demos.json"
action = ""
regulate = "{regulate}"
'''


def generic_seed(env_name: str, env: Any) -> HarnessVersion:
    return version_from_files(generic_seed_files(env_name, env), origin=f"<seed for {env_name}>")
