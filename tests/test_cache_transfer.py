"""The response cache carried between machines: `ecdysis cache export` / `import` (models/cache_transfer.py).
A compare resumed from an imported cache is in test_claim.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ecdysis.cli.main import app
from ecdysis.models import ChatRequest, MeteredModel, ResponseCache, ScriptedModel
from ecdysis.models.base import user
from ecdysis.models.cache_transfer import CacheFileError, export_entries, import_entries, parse_since


async def _filled(path: Path, *prompts: str) -> dict[str, str]:
    """A cache holding one scripted reply per prompt; returns prompt -> reply text."""
    cache = ResponseCache(path)
    model = MeteredModel(ScriptedModel([f"reply to {p}" for p in prompts], name="agent"), cache=cache)
    replies = {p: (await model.chat(ChatRequest(messages=[user(p)]))).text for p in prompts}
    cache.close()
    return replies


async def test_exported_entries_are_served_from_the_importing_cache_and_none_is_replaced(tmp_path: Path) -> None:
    replies = await _filled(tmp_path / "a.sqlite", "one", "two")
    assert export_entries(tmp_path / "a.sqlite", tmp_path / "a.jsonl.gz") == 2
    await _filled(tmp_path / "b.sqlite", "two")  # the next machine already holds "two" (its own reply kept)
    result = import_entries(tmp_path / "b.sqlite", [tmp_path / "a.jsonl.gz"])
    assert (result.read, result.added, result.present) == (2, 1, 1)
    again = import_entries(tmp_path / "b.sqlite", [tmp_path / "a.jsonl.gz"])
    assert (again.added, again.present) == (0, 2)
    never = MeteredModel(ScriptedModel([], name="agent"), cache=ResponseCache(tmp_path / "b.sqlite"))
    served = await never.chat(ChatRequest(messages=[user("one")]))  # the scripted model has no reply: a hit
    assert served.cache_hit and served.text == replies["one"]


async def test_since_keeps_only_the_entries_created_from_then_on(tmp_path: Path) -> None:
    await _filled(tmp_path / "a.sqlite", "old")
    cache = ResponseCache(tmp_path / "a.sqlite")
    cache._db.execute("UPDATE responses SET created = 1000.0")
    cache._db.commit()
    cache.close()
    await _filled(tmp_path / "a.sqlite", "new")
    assert export_entries(tmp_path / "a.sqlite", tmp_path / "since.jsonl.gz", since=2000.0) == 1
    with gzip.open(tmp_path / "since.jsonl.gz", "rt") as f:
        header, *rows = [json.loads(line) for line in f]
    assert header == {"format": "ecdysis-response-cache", "version": 1}
    assert len(rows) == 1 and rows[0]["created"] > 2000.0 and "reply to new" in rows[0]["response"]
    assert parse_since("20261205T1908") == parse_since("2026-12-05T19:08:00+00:00") == 1796497680.0
    with pytest.raises(CacheFileError, match="not a time"):
        parse_since("yesterday")


async def test_a_bad_line_is_named_and_nothing_of_the_file_is_imported(tmp_path: Path) -> None:
    await _filled(tmp_path / "a.sqlite", "one", "two")
    export_entries(tmp_path / "a.sqlite", tmp_path / "a.jsonl.gz")
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as f:
        lines = f.read().splitlines()
    broken = tmp_path / "broken.jsonl.gz"
    for bad, says in ((lines[:2] + ["{not json"], "broken.jsonl.gz:3: not a cache entry"),
                      (lines[:2] + [lines[2].replace(json.loads(lines[2])["key"], "../etc")], "not a 64-digit"),
                      (lines[:2] + [json.dumps(json.loads(lines[2]) | {"response": '{"text": 5}'})],
                       "not a stored reply"),
                      (lines[1:], "broken.jsonl.gz:1: not an ecdysis-response-cache")):
        with gzip.open(broken, "wt") as f:
            f.write("\n".join(bad) + "\n")
        with pytest.raises(CacheFileError, match=says):
            import_entries(tmp_path / "b.sqlite", [tmp_path / "a.jsonl.gz", broken])
        assert len(ResponseCache(tmp_path / "b.sqlite")) == 0  # the good file before it was not imported either
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(CacheFileError, match="not a readable cache file"):
        import_entries(tmp_path / "b.sqlite", [tmp_path / "plain.txt"])


def test_the_cli_says_what_it_did_and_exits_2_on_a_bad_file(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["cache", "export", str(tmp_path / "x.jsonl.gz"), "--cache",
                              str(tmp_path / "missing.sqlite")], terminal_width=200)
    assert out.exit_code == 2 and "no response cache at" in out.output and not (tmp_path / "x.jsonl.gz").exists()
    (tmp_path / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"format": "other"}\n'))
    out = runner.invoke(app, ["cache", "import", str(tmp_path / "bad.jsonl.gz"), "--cache",
                              str(tmp_path / "c.sqlite")], terminal_width=200)
    assert out.exit_code == 2 and "bad.jsonl.gz:1: not an ecdysis-response-cache version 1 file" in out.output
    out = runner.invoke(app, ["cache", "export", str(tmp_path / "y.jsonl.gz"), "--since", "soon", "--cache",
                              str(tmp_path / "c.sqlite")], terminal_width=200)
    assert out.exit_code == 2 and "--since 'soon' is not a time" in out.output
