"""Tool calls written as text by chat templates (Qwen2.5, Hermes: `<tool_call>{...}</tool_call>`).

Backends whose server or template does not parse calls itself use `split_tool_calls` to expose
them as structured `ToolCall`s, so everything above the model layer sees one shape.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .base import Message, ToolCall

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def call_id(index: int, name: str, arguments: str) -> str:
    """A deterministic id, so identical replies (and cache hits) produce identical transcripts."""
    return "call_" + hashlib.sha256(f"{index}:{name}:{arguments}".encode()).hexdigest()[:12]


def _as_call(obj: Any, index: int) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(id=call_id(index, obj["name"], text), name=obj["name"], arguments=text)


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Remove `<tool_call>` blocks from `text`; return (remaining text, parsed calls).

    A block that is not valid JSON is kept as a call with its raw text as `arguments` and the name
    `""` only if no name can be read; callers validate it like any other call.
    """
    calls: list[ToolCall] = []
    for index, match in enumerate(_TAGGED.finditer(text)):
        body = match.group(1).strip()
        try:
            call = _as_call(json.loads(body), index)
        except json.JSONDecodeError:
            name = re.search(r'"name"\s*:\s*"([^"]+)"', body)
            call = ToolCall(id=call_id(index, "", body), name=name.group(1) if name else "", arguments=body)
        if call is not None:
            calls.append(call)
    if not calls:
        return text, []
    return _TAGGED.sub("", text).strip(), calls


def for_template(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages for a Jinja chat template: tool-call arguments as objects (templates `tojson` them)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        item = m.to_openai()
        for call in item.get("tool_calls", []):
            try:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            except json.JSONDecodeError:
                pass
        out.append(item)
    return out


def forced_call_schema(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None
                       ) -> dict[str, Any] | None:
    """When a call is required, the JSON schema of one call (grammar-constrained decoding); else None."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    wanted = tools
    if isinstance(tool_choice, dict):
        name = tool_choice.get("function", {}).get("name")
        wanted = [t for t in tools if t["function"]["name"] == name] or tools
    options = [{"type": "object", "properties": {
        "name": {"type": "string", "enum": [t["function"]["name"]]},
        "arguments": t["function"].get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"]} for t in wanted]
    return options[0] if len(options) == 1 else {"anyOf": options}


def parse_reply_calls(text: str, forced: bool) -> tuple[str, list[ToolCall]]:
    """Calls from a local model's reply: a forced reply is one JSON call; otherwise `<tool_call>` blocks."""
    if forced:
        try:
            call = _as_call(json.loads(text), 0)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return "", [call]
    return split_tool_calls(text)
