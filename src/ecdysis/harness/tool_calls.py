"""H2 for schema tools: turn an assistant message into actions, validate them, repair near misses.

The library's default `realize` for native tool calling lives here, and so do the tool-call
repairs a harness can enable by name in `repairs.json`:

- `json_in_text`   calls written as JSON in the text instead of through the API
- `coerce_types`   argument values of the wrong type that convert losslessly ("3" -> 3)
- `near_tool_name` a tool name one small typo away from a real one
- `one_call_per_turn` several calls in one message where the environment wants one: keep the first

Validation uses the `jsonschema` library; a violation is returned as an error text that goes
back to the model as the tool's result (and is recorded), never as an exception.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from .api import Action, ActionContext, Reject, Reply, ToolCall, ToolSpec, answer, call, respond

TEXT_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"input": {"type": "string"}},
                                     "required": ["input"]}
_JSON_BLOCK = re.compile(r"```(?:json)?\s*([\[{].*?[\]}])\s*```", re.DOTALL)


def schema_of(spec: ToolSpec) -> dict[str, Any]:
    return spec.parameters if spec.parameters is not None else TEXT_INPUT_SCHEMA


def openai_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """Function-tool definitions for the model API; text tools take one `input` string."""
    return [ToolSpec(t.name, t.description, schema_of(t)).to_openai() for t in tools]


def parse_arguments(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def action_of(tc: ToolCall, tools: tuple[ToolSpec, ...]) -> Action:
    """A call as an action. Text-protocol tools get their `input`; bad JSON keeps the raw text."""
    args = parse_arguments(tc.arguments)
    spec = next((t for t in tools if t.name == tc.name), None)
    if spec is not None and spec.parameters is None and args is not None and isinstance(args.get("input"), str):
        return Action(tc.name, input=args["input"], call_id=tc.id)
    if args is None:
        return Action(tc.name, input=tc.arguments, arguments=None, call_id=tc.id)
    return call(tc.name, args, tc.id)


def native_realize(reply: Reply, ctx: ActionContext) -> Action | list[Action] | Reject:
    """Default H2 for native tool calling: calls become actions; plain text is the reply to the user
    (in a conversation) or the final answer. An empty message is rejected."""
    if reply.tool_calls:
        return [action_of(tc, ctx.tools) for tc in reply.tool_calls]
    text = reply.text.strip()
    if not text:
        return Reject("Your message was empty. Call a tool or reply in text.", rule="empty-reply")
    return respond(text) if ctx.conversational else answer(text)


def validate(action: Action, tools: tuple[ToolSpec, ...]) -> tuple[str, str] | None:
    """None if the action may run; else (kind, message for the model). Kinds: unknown_tool, invalid_arguments."""
    if action.is_answer or action.is_respond:
        return None
    spec = next((t for t in tools if t.name == action.tool), None)
    if spec is None:
        names = ", ".join(t.name for t in tools) or "(none)"
        return "unknown_tool", f"Error: unknown tool {action.tool!r}. Available tools: {names}."
    if spec.parameters is None:
        return None
    if action.arguments is None:
        return "invalid_arguments", (f"Error: the arguments of {action.tool} are not a JSON object: "
                                     f"{action.input[:200]!r}. Send arguments as JSON matching the schema.")
    import jsonschema  # imported on first schema check: episodes without schema tools never pay for it

    try:
        error = jsonschema.exceptions.best_match(_validator(spec.parameters).iter_errors(action.arguments))
    except jsonschema.SchemaError:  # the environment's schema is broken: let the tool decide
        return None
    if error is not None:  # what jsonschema.validate would raise, without checking the schema every call
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return "invalid_arguments", f"Error: invalid arguments for {action.tool} at {where}: {error.message}."
    return None


_VALIDATORS: dict[str, Any] = {}


def _validator(schema: dict[str, Any]) -> Any:
    """A jsonschema validator for `schema`, its schema checked once (SchemaError) and kept by content:
    checking the schema against its metaschema dominates the cost of validating one call."""
    import jsonschema

    key = json.dumps(schema, sort_keys=True, default=str)
    validator = _VALIDATORS.get(key)
    if validator is None:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validator = cls(schema)
        if len(_VALIDATORS) >= 512:
            _VALIDATORS.clear()
        _VALIDATORS[key] = validator
    return validator


# --- repairs -----------------------------------------------------------------------------------

def _as_calls(obj: Any, names: set[str]) -> list[tuple[str, str]]:
    """(name, raw arguments) of a call object {"name", "arguments"|"parameters"}, or of a list of them."""
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for item in items:
        if not (isinstance(item, dict) and item.get("name") in names):
            return []
        args = item.get("arguments", item.get("parameters", {}))
        out.append((item["name"], args if isinstance(args, str) else json.dumps(args)))
    return out


def calls_in_text(reply: Reply, tools: tuple[ToolSpec, ...]) -> Reply | None:
    """`json_in_text`: a message without API calls whose text holds {"name": TOOL, "arguments": {...}} — in
    fenced blocks (every block that is a call, or a list of calls), else the span from the first `{` (or `[`)
    to the last closing bracket. The text before the first call is kept as the message's text."""
    if reply.tool_calls or not tools:
        return None
    names = {t.name for t in tools}
    blocks = list(_JSON_BLOCK.finditer(reply))
    found: list[tuple[str, str]] = []
    for match in blocks:
        try:
            found += _as_calls(json.loads(match.group(1)), names)
        except json.JSONDecodeError:
            continue
    start = blocks[0].start() if found else -1
    if not found:
        starts = [i for i in (reply.find("{"), reply.find("[")) if i >= 0]
        start = min(starts) if starts else -1
        if start >= 0:
            try:
                found = _as_calls(json.loads(reply[start: max(reply.rfind("}"), reply.rfind("]")) + 1]), names)
            except json.JSONDecodeError:
                found = []
    if not found:
        return None
    prefix = reply[:start].strip()
    return Reply(prefix, tuple(ToolCall(f"text_call_{i}", name, raw) for i, (name, raw) in enumerate(found)))


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "integer" and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind == "number" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if kind == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind == "array" and not isinstance(value, list):
        return [_coerce(value, schema.get("items", {}))]
    if kind == "array" and isinstance(value, list):
        return [_coerce(v, schema.get("items", {})) for v in value]
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _coerce(v, props.get(k, {})) for k, v in value.items()}
    return value


def coerce_types(action: Action, tools: tuple[ToolSpec, ...]) -> Action | None:
    """`coerce_types`: convert argument values to the schema's types where that loses nothing."""
    spec = next((t for t in tools if t.name == action.tool), None)
    if spec is None or spec.parameters is None or action.arguments is None:
        return None
    fixed = _coerce(action.arguments, spec.parameters)
    return Action(action.tool, action.input, fixed, action.call_id) if fixed != action.arguments else None


def near_tool_name(action: Action, tools: tuple[ToolSpec, ...]) -> Action | None:
    """`near_tool_name`: an unknown tool name close to exactly one real one (difflib ratio >= 0.8)."""
    names = [t.name for t in tools]
    if action.tool in names or action.is_answer or action.is_respond:
        return None
    close = difflib.get_close_matches(action.tool, names, n=2, cutoff=0.8)
    if len(close) != 1:
        return None
    return Action(close[0], action.input, action.arguments, action.call_id)


def one_call_per_turn(actions: list[Action]) -> list[Action] | None:
    """`one_call_per_turn`: keep only the first of several tool calls in one message."""
    tool_actions = [a for a in actions if not (a.is_answer or a.is_respond)]
    return tool_actions[:1] if len(tool_actions) > 1 else None
