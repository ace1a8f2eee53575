"""`ecdysis cache export` / `ecdysis cache import`: the response cache carried between machines
(`models/cache_transfer.py`): a compare resumed on a fresh machine from an imported cache replays the first
machine's replies instead of calling the model again, at the same charged cost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..models.cache import default_cache_path
from ..models.cache_transfer import CacheFileError, export_entries, import_entries, parse_since
from .common import console, fail

CacheOpt = Annotated[Path | None, typer.Option("--cache", help="The response cache (default: $ECDYSIS_CACHE, "
                                                                 "else ~/.cache/ecdysis/responses.sqlite).")]


def cache_export(
    out: Annotated[Path, typer.Argument(help="The file to write (gzip JSON lines, e.g. cache.jsonl.gz).")],
    since: Annotated[str | None, typer.Option(help="Only entries created at or after this time (ISO 8601, UTC "
                                                   "unless it names a zone, or epoch seconds).")] = None,
    cache: CacheOpt = None,
) -> None:
    """Write the response cache's entries to a file another machine can import."""
    path = cache or default_cache_path()
    try:
        count = export_entries(path, out, parse_since(since) if since else None)
    except CacheFileError as exc:
        fail(str(exc))
        return
    console.print(f"exported {count} cache entries from {path} to {out}", highlight=False)


def cache_import(
    files: Annotated[list[Path], typer.Argument(help="Files written by `ecdysis cache export`.")],
    cache: CacheOpt = None,
) -> None:
    """Add the files' entries the response cache lacks (none replaced; nothing written if any file is bad).
    Import only files you trust: a run is served these replies as the model's."""
    path = cache or default_cache_path()
    try:
        result = import_entries(path, files)
    except CacheFileError as exc:
        fail(str(exc))
        return
    console.print(f"imported {result.added} of {result.read} cache entries into {path} "
                  f"({result.present} already there)", highlight=False)
