"""Framing of the host <-> sandbox channels: one JSON object per line, bounded in size, validated by a schema.

Everything that arrives on a channel is written by code the host does not trust. The host reads it only
through `read_message`, which never raises anything but `ProtocolError` (or returns None at end of stream):
an oversize line, bytes that are not UTF-8 JSON, a JSON value that is not an object, or an object that does
not validate against the expected message type are all protocol violations with a short reason, which the
caller turns into a recorded failure of that episode or request, never a crash of the host.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

if TYPE_CHECKING:
    import asyncio

MAX_LINE = 16 * 1024 * 1024  # bytes in one protocol line (a trajectory's events included)
M = TypeVar("M")


class ProtocolError(Exception):
    """A message on a channel broke the protocol; `str(exc)` says how (short, safe to record)."""


def encode(message: BaseModel | dict[str, Any]) -> bytes:
    """One line: the message as compact JSON, newline-terminated."""
    if isinstance(message, BaseModel):
        return message.model_dump_json().encode() + b"\n"
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def decode(line: bytes | str, schema: type[M] | TypeAdapter[M]) -> M:
    """Parse one line against `schema` (a pydantic model or a TypeAdapter); ProtocolError if it does not fit."""
    if isinstance(line, bytes | bytearray) and len(line) > MAX_LINE:
        raise ProtocolError(f"a line of {len(line)} bytes exceeds the {MAX_LINE}-byte limit")
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"not a JSON line: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(data).__name__}")
    try:
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            return schema.model_validate(data)  # type: ignore[return-value]
        adapter = schema if isinstance(schema, TypeAdapter) else TypeAdapter(schema)
        return adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "message"
        raise ProtocolError(f"invalid message ({where}: {first.get('msg', 'does not validate')})") from None


async def read_message(reader: asyncio.StreamReader, schema: type[M] | TypeAdapter[M],
                       limit: int = MAX_LINE) -> M | None:
    """The next message, or None at end of stream. An oversize line is a ProtocolError; the stream is then
    unusable (the caller ends the worker), since the rest of that line is still unread."""
    import asyncio  # here, not at the top: a sandbox worker only decodes, and importing asyncio delays its start

    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        line = exc.partial  # a last line without its newline
    except asyncio.LimitOverrunError as exc:
        raise ProtocolError(f"a line longer than the stream's {exc.consumed}-byte buffer limit") from None
    except ValueError as exc:  # readuntil's limit, on some Python versions
        raise ProtocolError(f"a line over the size limit ({exc})") from None
    if len(line) > limit:
        raise ProtocolError(f"a line of {len(line)} bytes exceeds the {limit}-byte limit")
    return decode(line, schema)
