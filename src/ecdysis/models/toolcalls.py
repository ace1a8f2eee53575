"""Tool calls written as text by chat templates (Qwen2.5, Hermes: `<tool_call>{...}</tool_call>`).

Backends whose server or template does not parse calls itself use `split_tool_calls` to expose
them as structured `ModelToolCall`s, so everything above the model layer sees one shape.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .base import GenerationParams, Message, ModelToolCall

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def call_id(index: int, name: str, arguments: str) -> str:
    """A deterministic id, so identical replies (and cache hits) produce identical transcripts."""
    return "call_" + hashlib.sha256(f"{index}:{name}:{arguments}".encode()).hexdigest()[:12]


def _as_call(obj: Any, index: int) -> ModelToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ModelToolCall(id=call_id(index, obj["name"], text), name=obj["name"], arguments=text)


def _undouble(body: str) -> str:
    """Qwen2.5's template shows the call as `{{"name": ...}}` (a literal in its Jinja string); models copy
    it, often with unbalanced closing braces. Returns the first JSON object, or the text unchanged."""
    body = body.strip()
    while body.startswith("{{"):
        body = body[1:]
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError:
        return body
    return json.dumps(obj) if not body[end:].strip(" \n}") else body


def split_tool_calls(text: str, tool_names: set[str] | None = None) -> tuple[str, list[ModelToolCall]]:
    """Remove `<tool_call>` blocks from `text`; return (remaining text, parsed calls).

    Also accepted: a reply that is nothing but the template's call object (tags omitted, braces
    doubled as Qwen2.5's template prints them) naming one of `tool_names`. A tagged block that is
    not valid JSON is kept as a call with its raw text as `arguments`; callers validate it.
    """
    if tool_names and "<tool_call>" not in text:
        try:
            call = _as_call(json.loads(_undouble(text)), 0)
        except json.JSONDecodeError:
            call = None
        if call is not None and call.name in tool_names:
            return "", [call]
    calls: list[ModelToolCall] = []
    for index, match in enumerate(_TAGGED.finditer(text)):
        body = _undouble(match.group(1))
        try:
            call = _as_call(json.loads(body), index)
        except json.JSONDecodeError:
            name = re.search(r'"name"\s*:\s*"([^"]+)"', body)
            call = ModelToolCall(id=call_id(index, "", body), name=name.group(1) if name else "", arguments=body)
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


def under_grammar(params: GenerationParams) -> bool:
    """Whether a reply to `params` is generated under a grammar (a JSON schema, or a required call's schema):
    the backends report its tokens as `Usage.constrained_tokens` (they cost more per token, models/charge.py)."""
    return params.json_schema is not None or forced_call_schema(params.tools, params.tool_choice) is not None


def tool_names_of(tools: list[dict[str, Any]] | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


def parse_reply_calls(text: str, forced: bool, tool_names: set[str]) -> tuple[str, list[ModelToolCall]]:
    """Calls from a local model's reply: a forced reply is one JSON call; otherwise the template's form."""
    if forced:
        try:
            call = _as_call(json.loads(text), 0)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return "", [call]
    return split_tool_calls(text, tool_names)
