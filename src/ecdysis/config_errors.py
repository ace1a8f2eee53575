"""How a configuration that cannot run is reported: where the bad value came from (a `--set`, an option, or
the file and the line that sets it), what it should be, and no pydantic wording or URLs."""

from __future__ import annotations

import re
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot run; the message names where the bad value came from (the file, with its
    line when it can be found, or the `--set`/flag that gave it) and what values are valid."""


def key_parts(key: str) -> list[str]:
    """`a.b."c.d"` -> ["a", "b", "c.d"] (quoted parts may hold dots)."""
    return [p.strip("\"'") for p in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', key.strip())]


def dotted(loc: tuple[Any, ...]) -> str:
    """A key path as the config writes it: `model_settings."local:x".n_ctx`."""
    return ".".join(str(p) if re.fullmatch(r"[A-Za-z0-9_-]+", str(p)) else f'"{p}"' for p in loc)


def line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line of a TOML text that sets the key at `loc` (or the inline table holding it), if one does."""
    section: tuple[str, ...] = ()
    want = tuple(str(p) for p in loc)
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[\[?([^\]]+)\]\]?\s*(#.*)?$", line)
        if header:
            section = tuple(key_parts(header.group(1).strip()))
            continue
        assignment = re.match(r"\s*([^=#\[]+?)\s*=", line)
        if assignment:
            full = section + tuple(p.strip() for p in key_parts(assignment.group(1)))
            if want[:len(full)] == full:
                return number
    return None


def should_be(error: dict[str, Any]) -> str:
    """What a pydantic error says the value should be, in the config's words (no pydantic URL)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        return f"should be {bounds[kind]} {next(iter(ctx.values())):g}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "should be a whole number"
    if kind in ("float_parsing", "float_type"):
        return "should be a number"
    if kind in ("bool_parsing", "bool_type"):
        return "should be true or false"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return "should be a section of keys (a [table])"
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Input ")
    return message[:1].lower() + message[1:]


def problem(where: str, key: str, what: str, value: Any = ...) -> str:
    """`WHERE: KEY should be ... (got VALUE)`, the value's repr cut to 60 characters."""
    got = "" if value is ... else f" (got {value!r:.60})"
    return f"{where}: {key} {what}{got}"


def config_error(problems: list[str]) -> ConfigError:
    """One error for every problem found, one per line."""
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f"{len(problems)} problems in the configuration:\n  " + "\n  ".join(problems))
