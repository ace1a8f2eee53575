"""Property-based fuzzing (Hypothesis) of what users and models hand us: task files, configs, role
replies, implementer replies, tool calls. Each must give a clear error of its own kind, never a
traceback from deep inside."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import seed_with  # noqa: E402

from ecdysis.agent.realize import as_reply, realize_message  # noqa: E402
from ecdysis.config import ConfigError, load_config  # noqa: E402
from ecdysis.envs.base import TaskFileError  # noqa: E402
from ecdysis.envs.jsonl_suite import JsonlSuite  # noqa: E402
from ecdysis.harness.api import ActionContext, ToolSpec  # noqa: E402
from ecdysis.harness.repairs import CATALOG, parse_repairs  # noqa: E402
from ecdysis.harness.tool_calls import native_realize  # noqa: E402
from ecdysis.models.toolcalls import split_tool_calls  # noqa: E402
from ecdysis.trainer.checks import CheckFailed  # noqa: E402
from ecdysis.trainer.implement import reply_content  # noqa: E402
from ecdysis.trainer.spec import SpecError, parse_spec  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HARNESS = seed_with("gsm8k")


@FAST
@given(st.lists(st.one_of(st.text(max_size=60), JSON.map(json.dumps)), max_size=6))
def test_task_files_load_or_name_the_line(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.jsonl"
        path.write_text("\n".join(line.replace("\n", " ") for line in lines))
        try:
            JsonlSuite(path=path).all_tasks()
        except TaskFileError as exc:
            assert str(path) in str(exc) and ":" in str(exc)


@FAST
@given(st.dictionaries(st.sampled_from(["run", "env", "train", "agent", "eval", "roles", "trian", "x"]),
                       st.dictionaries(st.text(min_size=1, max_size=10), JSON, max_size=3), max_size=4))
def test_configs_validate_or_raise_config_errors(data: dict) -> None:
    overrides = [f"{section}.{key}={json.dumps(value)}" for section, items in data.items()
                 for key, value in items.items() if key.isidentifier()]
    try:
        load_config(None, overrides)
    except ConfigError:
        pass


@FAST
@given(st.one_of(st.text(max_size=300), JSON.map(json.dumps)))
def test_role_and_implementer_replies_fail_cleanly(text: str) -> None:
    try:
        parse_spec(text, HARNESS, {"P1"})
    except SpecError:
        pass
    try:
        reply_content(text)
    except CheckFailed:
        pass


TOOLS = (ToolSpec("lookup", "Find.", {"type": "object", "properties": {"id": {"type": "integer"}},
                                      "required": ["id"]}),)


@FAST
@given(st.text(max_size=200), st.lists(st.fixed_dictionaries({"name": st.text(max_size=12),
                                                              "arguments": st.text(max_size=40)}), max_size=3))
def test_any_assistant_message_realizes_to_actions_or_a_rejection(text: str, calls: list[dict]) -> None:
    repairs = parse_repairs(json.dumps(list(CATALOG)))
    for conversational in (False, True):
        out = realize_message(native_realize, repairs, as_reply({"text": text, "tool_calls": calls}),
                              ActionContext(TOOLS, 0, "task", conversational))
        assert (out.reject is None) == bool(out.actions)
    split_tool_calls(text, {"lookup"})
