"""Real backends with SmolLM2-135M: embedded llama.cpp, and llama.cpp's OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ecdysis.models import (
    ChatRequest,
    GenerationParams,
    Message,
    MeteredModel,
    ModelError,
    ResponseCache,
    build_model,
)
from ecdysis.models.openai_http import OpenAICompatModel

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
}


def req(text: str, **params: object) -> ChatRequest:
    return ChatRequest(messages=[Message(role="user", content=text)],
                       params=GenerationParams(**{"max_tokens": 24, **params}))


async def test_embedded_generates_text(smollm_path: Path) -> None:
    model = build_model("local:smollm2-135m")
    response = await model.chat(req("Name a fruit."))
    assert response.text.strip()
    assert response.usage.completion_tokens > 0 and response.usage.prompt_tokens > 0
    assert response.finish_reason in {"stop", "length"}
    assert response.model_id.startswith("llama.cpp:b179c952")


async def test_embedded_json_schema_reply_parses(smollm_path: Path) -> None:
    model = build_model("local:smollm2-135m")
    response = await model.chat(req("Where is the Eiffel Tower? Reply in JSON.", max_tokens=60, json_schema=SCHEMA))
    data = json.loads(response.text)
    assert set(data) >= {"city", "country"} and isinstance(data["city"], str)
    # generated under the grammar: charged at the grammar's rate (models/charge.py); a free reply is not
    assert response.usage.constrained_tokens == response.usage.completion_tokens > 0
    free = await model.chat(req("Where is the Eiffel Tower?", max_tokens=8))
    assert free.usage.constrained_tokens == 0 and free.usage.completion_tokens > 0


async def test_second_identical_call_hits_cache_without_model_time(smollm_path: Path, tmp_path: Path) -> None:
    metered = MeteredModel(build_model("local:smollm2-135m"), cache=ResponseCache(tmp_path / "c.sqlite"))
    first = await metered.chat(req("Count to five."))
    start = time.perf_counter()
    second = await metered.chat(req("Count to five."))
    elapsed = time.perf_counter() - start
    assert not first.cache_hit and first.latency_s > 0
    assert second.cache_hit and second.text == first.text and second.latency_s == 0.0
    assert metered.stats.cache_hits == 1 and metered.stats.model_time_s == first.latency_s
    assert elapsed < first.latency_s


async def test_http_backend_against_real_llama_server(llama_server: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, base = llama_server
    model = build_model(f"{base}::smol")
    single = await model.chat(req("Say hello."))
    assert single.text.strip() and single.usage.completion_tokens > 0
    batch = await asyncio.gather(*(model.chat(req(f"Give one word about the number {i}.")) for i in range(4)))
    assert all(r.text.strip() for r in batch)
    structured = await model.chat(req("Where is the Colosseum? Reply in JSON.", max_tokens=60, json_schema=SCHEMA))
    assert {"city", "country"} <= set(json.loads(structured.text))
    sampled = req("Write one sentence about the sea.", temperature=1.0)
    first, _, again = [(await model.chat(r)).text for r in (sampled, req("Name a bird.", temperature=1.0), sampled)]
    assert first == again  # seeded from the request (sample_index), not from the server's previous call


async def test_server_stopped_midway_gives_bounded_retries_then_clear_error(
    llama_server: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, base = llama_server
    model = OpenAICompatModel(base, "smol", max_retries=2, backoff_initial_s=0.1, backoff_max_s=0.5,
                              attempt_timeout_s=30)
    assert (await model.chat(req("Warm up."))).text
    calls = [asyncio.create_task(model.chat(req(f"Write a long story about dragon {i}.", max_tokens=400)))
             for i in range(3)]
    await asyncio.sleep(0.5)
    proc.kill()
    proc.wait()
    start = time.perf_counter()
    results = await asyncio.gather(*calls, return_exceptions=True)
    failures = [r for r in results if isinstance(r, ModelError)]
    assert failures, results
    assert all(isinstance(r, ModelError) or r.text for r in results)  # type: ignore[union-attr]
    assert "cannot reach" in str(failures[0]) and "Is the server running" in str(failures[0])
    with pytest.raises(ModelError, match="after 3 attempts"):
        await model.chat(req("Anyone there?"))
    assert time.perf_counter() - start < 30


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def test_embedded_backend_produces_a_tool_call(smollm_path: Path) -> None:
    model = build_model("local:smollm2-135m")
    # room for the whitespace the JSON grammar allows (this build's SmolLM2 spends ~40 tokens on `{ "name" : ...`)
    response = await model.chat(req("What is the weather in Paris?", max_tokens=120, tools=[WEATHER_TOOL],
                                    tool_choice="required"))
    assert response.finish_reason != "length", response.text
    assert len(response.tool_calls) == 1 and response.tool_calls[0].name == "get_weather"
    assert isinstance(json.loads(response.tool_calls[0].arguments)["city"], str)


async def test_http_backend_tool_call_against_real_llama_server(
    llama_server: tuple[subprocess.Popen[bytes], str], tmp_path: Path,
) -> None:
    proc, base = llama_server
    metered = MeteredModel(build_model(f"{base}::smol"), cache=ResponseCache(tmp_path / "c.sqlite"))
    forced = {"type": "function", "function": {"name": "get_weather"}}
    response = await metered.chat(req("Weather in Rome, please.", max_tokens=40, tools=[WEATHER_TOOL],
                                      tool_choice=forced))
    assert [c.name for c in response.tool_calls] == ["get_weather"]
    assert "city" in json.loads(response.tool_calls[0].arguments)
    again = await metered.chat(req("Weather in Rome, please.", max_tokens=40, tools=[WEATHER_TOOL],
                                   tool_choice=forced))
    assert again.cache_hit and again.tool_calls == response.tool_calls
    other_tools = [{**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "description": "Weather now."}}]
    changed = await metered.chat(req("Weather in Rome, please.", max_tokens=40, tools=other_tools,
                                     tool_choice=forced))
    assert not changed.cache_hit  # the tools are part of the cache key


async def test_embedded_episodes_keep_their_kv_across_interleaved_turns(smollm_path: Path) -> None:
    from ecdysis.models.llama_local import LlamaCppModel

    shared = ("You are a helpful assistant. Answer briefly. " * 10).strip()

    def turn(question: str, history: list[Message], session: str) -> ChatRequest:
        messages = [Message(role="system", content=shared), *history, Message(role="user", content=question)]
        return ChatRequest(messages=messages, params=GenerationParams(max_tokens=10, session=session))

    async def episode_turns(model: LlamaCppModel, order: list[str]) -> dict[str, list[Any]]:
        firsts = {"A": "Name a color.", "B": "Name a fruit."}
        replies: dict[str, list[Any]] = {"A": [], "B": []}
        for session in order:
            done = replies[session]
            history = [] if not done else [Message(role="user", content=firsts[session]),
                                           Message(role="assistant", content=done[0].text)]
            done.append(await model.chat(turn("Another one?" if done else firsts[session], history, session)))
        return replies

    interleaved = await episode_turns(LlamaCppModel("smollm2-135m", n_ctx=1024, slots=2, instance="kv-i"),
                                      ["A", "B", "A", "B"])
    alone = await episode_turns(LlamaCppModel("smollm2-135m", n_ctx=1024, slots=1, instance="kv-s"),
                                ["A", "A", "B", "B"])
    assert [r.text for r in interleaved["A"] + interleaved["B"]] == [r.text for r in alone["A"] + alone["B"]]
    for session in "AB":  # the second turn reused the episode's whole first turn, though the other ran between
        first, second = interleaved[session]
        assert second.usage.cached_tokens >= first.usage.prompt_tokens
    assert interleaved["B"][0].usage.cached_tokens > 0  # a new episode reuses the shared system prompt
    cache_a = req("x", session="one").canonical_json()
    assert cache_a == req("x", session="two").canonical_json()  # the session is not part of the cache key


async def test_embedded_reports_the_prompt_prefix_it_reused(smollm_path: Path) -> None:
    from ecdysis.models.llama_local import LlamaCppModel

    model = LlamaCppModel("smollm2-135m", n_ctx=1024, instance="prefix-test")
    shared = Message(role="system", content="You are a careful assistant who answers briefly. " * 12)
    first = await model.chat(ChatRequest(messages=[shared, Message(role="user", content="What is 2+2?")],
                                         params=GenerationParams(max_tokens=4)))
    second = await model.chat(ChatRequest(messages=[shared, Message(role="user", content="Name a color.")],
                                          params=GenerationParams(max_tokens=4)))
    assert first.usage.cached_tokens == 0
    # the shared system prompt was not processed again; the differing question was
    assert first.usage.prompt_tokens - 20 < second.usage.cached_tokens < second.usage.prompt_tokens


def test_a_released_episode_drops_its_saved_state(smollm_path: Path) -> None:
    from ecdysis.models.llama_local import SessionStates

    states = SessionStates(keep=2)
    states.saved["done"] = (b"kv", None)
    states.current = "running"
    states.release("done")
    states.release("running")
    assert not states.saved and states.current is None


def test_every_generation_runs_on_one_thread(smollm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libgomp keeps a thread team per calling thread; calls from asyncio's pool (a new thread from call to
    call) made a team each and throttled them all to passive speed. Concurrent calls and calls from
    separate event loops all generate on the backend's one thread."""
    import threading

    from ecdysis.models.llama_local import LlamaCppModel

    threads: list[int] = []
    generate = LlamaCppModel._generate

    def recorded(self: LlamaCppModel, *args: Any) -> Any:
        threads.append(threading.get_ident())
        return generate(self, *args)

    monkeypatch.setattr(LlamaCppModel, "_generate", recorded)
    model = LlamaCppModel("smollm2-135m", n_ctx=1024, instance="one-thread")

    async def burst(tag: str) -> None:
        await asyncio.gather(*(model.chat(req(f"{tag} {i}", max_tokens=2)) for i in range(3)))

    asyncio.run(burst("first"))
    asyncio.run(burst("second"))
    assert len(threads) == 6
    assert set(threads) == {threads[0]} and threads[0] != threading.get_ident()


async def test_a_cancelled_call_stops_its_generation_at_the_next_step(smollm_path: Path) -> None:
    """Ctrl-C cancels the task awaiting a reply; the generation itself used to run to its end on the llama.cpp
    thread (an interrupted command waited for it at exit). Now it stops at llama.cpp's next step, and the
    context serves the next call."""
    from ecdysis.models.llama_local import _COMPUTE, LlamaCppModel, load

    model = LlamaCppModel("smollm2-135m", n_ctx=2048, instance="cancel")
    llm = load(model.path, 2048, None, "cancel").llm
    long = req("Count from 1 to 500, one number per line.", max_tokens=1500, temperature=0.0)
    task = asyncio.create_task(model.chat(long))
    start = llm.n_tokens
    while llm.n_tokens < start + 40 and not task.done():  # the prompt, then some generated tokens
        await asyncio.sleep(0.05)
    assert not task.done(), "the reply ended before it could be cancelled"
    at_cancel = llm.n_tokens
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wrap_future(_COMPUTE.submit(lambda: None))  # the llama.cpp thread is free again
    assert llm.n_tokens <= at_cancel + 8  # stopped within a step or so (the old code: 120 more, to its end)
    after = await model.chat(req("Name a fruit.", max_tokens=8))
    assert after.text.strip() and after.usage.completion_tokens > 0


async def test_a_sampled_reply_depends_only_on_its_request(smollm_path: Path) -> None:
    from ecdysis.models.llama_local import LlamaCppModel

    # temperature 1: unseeded, llama-cpp-python chains each call's seed from the call before it
    asked = req("Write one sentence about the sea.", temperature=1.0)
    model = LlamaCppModel("smollm2-135m", n_ctx=1024, instance="seeded-a")
    first = (await model.chat(asked)).text
    await model.chat(req("Write one sentence about a mountain.", temperature=1.0))
    again = (await model.chat(asked)).text
    fresh = (await LlamaCppModel("smollm2-135m", n_ctx=1024, instance="seeded-b").chat(asked)).text
    assert first == again == fresh  # the same request, after other calls or on a fresh instance: the same sample
    other = {(await model.chat(req("Write one sentence about the sea.", temperature=1.0, sample_index=i))).text
             for i in (1, 2, 3)}
    assert len(other | {first}) > 1  # a deliberate resample (sample_index) still samples anew


async def test_a_prompt_longer_than_the_context_says_which_setting_to_raise(smollm_path: Path) -> None:
    from ecdysis.models.llama_local import LlamaCppModel

    model = LlamaCppModel("smollm2-135m", n_ctx=256, instance="small-window")
    await model.chat(req("Hi."))  # loaded
    with pytest.raises(ModelError) as caught:
        await model.chat(req("word " * 400))
    message = str(caught.value)  # about 400 prompt tokens + 24 for the reply: 512 fits
    assert "context window of 256" in message
    assert "model_settings.\"local:smollm2-135m\".n_ctx=512" in message and "trained on 8192" in message
    with pytest.raises(ModelError, match="trained on 8192 tokens, so no window fits"):
        await model.chat(req("word " * 9000))
