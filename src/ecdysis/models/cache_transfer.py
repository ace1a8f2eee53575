"""Moving response-cache entries between machines (`ecdysis cache export` / `ecdysis cache import`).

A cache file is gzip-compressed JSON lines: a header `{"format": "ecdysis-response-cache", "version": 1}`, then
one entry per line (`key`, `model`, `response`: the stored `ChatResponse` JSON, `created`: when the call ran).
Entries keep their key, so a run resumed on another machine from an imported cache is served the replies the
first machine got, and is charged what they cost when they ran (`charge.py`): the same numbers, without the
model time. An import adds only keys the cache lacks (an entry already there is never replaced) and checks the
whole file before it writes anything. A cache file is model replies: import only files you trust, as a
run's results are only as good as the replies it was served.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from .base import ChatResponse
from .cache import CacheError, ResponseCache

FORMAT = "ecdysis-response-cache"
VERSION = 1
_KEY = re.compile(r"[0-9a-f]{64}")


class CacheFileError(ValueError):
    """A cache file that cannot be read or imported; the message names the file, the line and what to do."""


@dataclass(frozen=True)
class CacheEntry:
    """One stored reply: its cache key, the model identity, the `ChatResponse` JSON and when the call ran."""

    key: str
    model: str
    response: str
    created: float


@dataclass(frozen=True)
class ImportResult:
    read: int  # entries in the files
    added: int  # new to the cache
    present: int  # keys the cache already held (kept as they were)


def parse_since(text: str) -> float:
    """A time as seconds since the epoch: ISO 8601 (`2026-12-05T19:08`, `20261205T1908`; UTC unless it says
    otherwise) or a number of seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CacheFileError(f"--since {text!r} is not a time; give ISO 8601 (2026-12-05T19:08, UTC unless it "
                             "names a zone) or seconds since the epoch") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _read_only(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise CacheFileError(f"no response cache at {path}; name one with --cache (or $ECDYSIS_CACHE)")
    try:
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise CacheFileError(f"response cache {path} cannot be opened ({exc})") from None


def export_entries(cache: Path, out: Path, since: float | None = None) -> int:
    """Write the cache's entries (those created at or after `since`, if given) to `out`, oldest first; returns
    how many. The file is written beside `out` and renamed into place, so a killed export leaves no half file."""
    db = _read_only(cache)
    try:
        rows = db.execute("SELECT key, model, response, created FROM responses WHERE created >= ? "
                          "ORDER BY created, key", (since if since is not None else float("-inf"),)).fetchall()
    except sqlite3.Error as exc:
        raise CacheFileError(f"response cache {cache} cannot be read ({exc})") from None
    finally:
        db.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"format": FORMAT, "version": VERSION}) + "\n")
        for key, model, response, created in rows:
            f.write(json.dumps({"key": key, "model": model, "response": response, "created": created}) + "\n")
    os.replace(partial, out)
    return len(rows)


def read_entries(path: Path) -> list[CacheEntry]:
    """Every entry of a cache file, each checked; CacheFileError names the first bad line."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise CacheFileError(f"{path}: not a readable cache file ({exc}); write one with `ecdysis cache "
                             "export`") from None
    if not lines or _header(lines[0]) != {"format": FORMAT, "version": VERSION}:
        raise CacheFileError(f"{path}:1: not an {FORMAT} version {VERSION} file (its first line should be "
                             f'{{"format": "{FORMAT}", "version": {VERSION}}})')
    entries = []
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            entries.append(_entry(line, f"{path}:{number}"))
    return entries


def _header(line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def _entry(line: str, where: str) -> CacheEntry:
    try:
        row = json.loads(line)
        entry = CacheEntry(key=row["key"], model=row["model"], response=row["response"], created=float(row["created"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CacheFileError(f"{where}: not a cache entry ({type(exc).__name__}: {exc}); every line after the "
                             "header is {key, model, response, created}") from None
    if not isinstance(entry.key, str) or not _KEY.fullmatch(entry.key):
        raise CacheFileError(f"{where}: the key {entry.key!r} is not a 64-digit hex cache key")
    if not isinstance(entry.model, str) or not isinstance(entry.response, str):
        raise CacheFileError(f"{where}: model and response should be strings")
    try:
        ChatResponse.model_validate_json(entry.response)
    except ValidationError as exc:
        raise CacheFileError(f"{where}: the response is not a stored reply ({exc.error_count()} problem(s), "
                             f"first: {exc.errors()[0]['msg']})") from None
    return entry


def import_entries(cache: Path, files: list[Path]) -> ImportResult:
    """Add the files' entries the cache lacks, in one transaction, after every file was read and checked."""
    entries = [entry for path in files for entry in read_entries(path)]
    try:
        target = ResponseCache(cache)  # creates the file and its table; CacheError says what to do
        try:
            added = target.add_missing([(e.key, e.model, e.response, e.created) for e in entries])
        finally:
            target.close()
    except CacheError as exc:
        raise CacheFileError(str(exc)) from None
    except sqlite3.Error as exc:
        raise CacheFileError(f"response cache {cache} cannot be written ({exc}); nothing was imported") from None
    return ImportResult(read=len(entries), added=added, present=len({e.key for e in entries}) - added)
