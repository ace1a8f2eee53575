"""`ecdysis serve`: the openai SDK against a real uvicorn server on 127.0.0.1 with a scripted upstream."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from ecdysis.cli.main import app
from ecdysis.models.base import ChatRequest, ChatResponse, ModelToolCall, Usage
from ecdysis.serve.proxy import ServeSettings
from ecdysis.serve.server import background, build_proxy

REGULATE = '''from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    repeats = sum(1 for action, _ in state.history if action.key() == state.action.key())
    if repeats >= 2:
        return Verdict(stop=True, reason="the same call was repeated three times")
    if repeats == 1:
        return Verdict(annotation="(You already made this exact call.)")
    return Verdict()
'''
LOOKUP = {"type": "function", "function": {
    "name": "lookup_order", "description": "Look up an order by its number.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}}
REFUND = {"type": "function", "function": {
    "name": "refund", "description": "Refund an order.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}, "reason": {"type": "string"}},
                   "required": ["order_id", "reason"]}}}


def write_harness(root: Path, repairs: list[str] | None = None, retries: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "harness.toml").write_text(f'''name = "helpdesk-frozen"
env = "helpdesk"
tool_calling = "native"

[generation]
max_tokens = 200

[budget]
max_turns = 10
max_rejections = {retries}

[files]
action = ""
''')
    (root / "contract.md").write_text("HARNESS RULES: look up the order before any change.\nTools:\n{tools}\n")
    (root / "skills.json").write_text(json.dumps([
        {"id": "s1", "trigger": "refund money back", "tip": "Refunds need a reason."},
        {"id": "s2", "trigger": "password login", "tip": "Never reset passwords."}]))
    (root / "demos.json").write_text(json.dumps([{"user": "Where is order 7?", "assistant": "Let me look it up."}]))
    (root / "regulate.py").write_text(REGULATE)
    if repairs is not None:
        (root / "repairs.json").write_text(json.dumps(repairs))
    return root


class Upstream:
    """A scripted upstream that returns exactly what its script says (text and native calls), so a call
    written as JSON text stays text. `script(messages) -> str | (text, calls)`."""

    def __init__(self, script: Callable[[list[Any]], Any], delay_s: float = 0.0) -> None:
        self.script = script
        self.delay_s = delay_s
        self.requests: list[ChatRequest] = []

    @property
    def identity(self) -> str:
        return "scripted:serve-test"

    async def chat(self, request: ChatRequest) -> ChatResponse:
        import asyncio

        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = self.script(list(request.messages))
        text, calls = (out, []) if isinstance(out, str) else out
        return ChatResponse(text=text, tool_calls=[ModelToolCall(**c) for c in calls],
                            usage=Usage(prompt_tokens=11, completion_tokens=5), latency_s=self.delay_s)


def client(base: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, default_headers=headers or None)


@pytest.fixture
def harness(tmp_path: Path) -> Path:
    return write_harness(tmp_path / "harness", ["json_in_text", "coerce_types", "near_tool_name"])


def test_json_text_call_becomes_real_tool_call_with_harness_applied(harness: Path, tmp_path: Path) -> None:
    replies = iter(['Checking.\n{"name": "lookup_order", "arguments": {"order_id": "42"}}',
                    ("", [{"id": "u1", "name": "refnd", "arguments": '{"order_id": 42, "reason": "late"}'}])])
    upstream = Upstream(lambda m: next(replies))
    proxy = build_proxy(harness, "scripted:test", store_dir=tmp_path / "store", upstream=upstream)
    with background(proxy) as base:
        reply = client(base).chat.completions.create(
            model="anything", tools=[LOOKUP, REFUND],
            messages=[{"role": "system", "content": "You are Acme's support agent."},
                      {"role": "user", "content": "I want my money back (refund) for order 42"}])
        near = client(base).chat.completions.create(
            model="anything", tools=[LOOKUP, REFUND], messages=[{"role": "user", "content": "refund 42"}])
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "lookup_order" and call.type == "function"
    assert json.loads(call.function.arguments) == {"order_id": 42}  # "42" coerced to the schema's integer
    assert call.id.startswith("call_") and message.content == "Checking."
    fixed = near.choices[0].message.tool_calls[0]
    assert (fixed.id, fixed.function.name) == ("u1", "refund")  # near-miss name fixed
    sent = upstream.requests[0]
    system = sent.messages[0]
    assert system.role == "system" and system.content.startswith("HARNESS RULES")  # contract first (shared prefix)
    assert "- lookup_order(order_id): Look up an order" in system.content
    assert system.content.endswith("You are Acme's support agent.")
    assert [m.content for m in sent.messages[1:3]] == ["Where is order 7?", "Let me look it up."]  # demo
    first_user = sent.messages[3]
    assert first_user.content.startswith("Tips:\n- Refunds need a reason.")  # retrieved for this conversation
    assert "Never reset passwords" not in first_user.content
    assert sent.params.tools and sent.params.max_tokens == 200  # harness generation settings fill the gaps


def test_rejected_reply_is_retried_and_agent_sees_only_the_final_one(harness: Path, tmp_path: Path) -> None:
    replies = iter([
        "",  # the harness rejects an empty reply (H2 rule empty-reply)
        ("", [{"id": "c1", "name": "refund", "arguments": '{"order_id": 42}'}]),  # schema violation: no reason
        ("", [{"id": "c2", "name": "refund", "arguments": '{"order_id": 42, "reason": "late"}'}]),
    ])
    upstream = Upstream(lambda m: next(replies))
    proxy = build_proxy(harness, "scripted:test", store_dir=tmp_path / "store", upstream=upstream)
    with background(proxy) as base:
        raw = client(base).chat.completions.with_raw_response.create(
            model="m", tools=[LOOKUP, REFUND], messages=[{"role": "user", "content": "refund order 42"}])
    reply = raw.parse()
    assert raw.headers["x-ecdysis-attempts"] == "3"
    calls = reply.choices[0].message.tool_calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("c2", "refund", {"order_id": 42, "reason": "late"})]
    assert reply.usage.prompt_tokens == 33  # the three upstream calls, accounted to this request
    second, third = upstream.requests[1].messages, upstream.requests[2].messages
    assert second[-1].role == "user" and "empty" in second[-1].content  # the harness's feedback
    assert third[-1].role == "tool" and third[-1].tool_call_id == "c1" and "reason" in third[-1].content


def test_streaming_and_h4_annotation_and_stop(harness: Path, tmp_path: Path) -> None:
    upstream = Upstream(lambda m: ("", [{"id": f"k{len(m)}", "name": "lookup_order", "arguments": '{"order_id": 5}'}]))
    proxy = build_proxy(harness, "scripted:test", store_dir=tmp_path / "store", upstream=upstream)
    history: list[dict[str, Any]] = [{"role": "user", "content": "where is order 5"}]
    with background(proxy) as base:
        sdk = client(base, **{"X-Ecdysis-Conversation": "conv-stream"})
        for turn in range(4):
            stream = sdk.chat.completions.create(model="m", tools=[LOOKUP], messages=history, stream=True,
                                                 stream_options={"include_usage": True})
            chunks = list(stream)
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            text = "".join(d.content or "" for d in deltas)
            calls = [tc for d in deltas for tc in (d.tool_calls or [])]
            assert chunks[-1].usage is not None
            if turn == 3:  # the third identical result: H4 stops without asking the upstream
                assert calls == [] and "repeated three times" in text
                break
            assert len(calls) == 1 and calls[0].function.name == "lookup_order"
            history.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].id, "type": "function", "function": {"name": "lookup_order",
                                                                      "arguments": calls[0].function.arguments}}]})
            history.append({"role": "tool", "tool_call_id": calls[0].id, "content": "order 5: shipped"})
    assert len(upstream.requests) == 3
    tool_results = [m.content for m in upstream.requests[2].messages if m.role == "tool"]
    assert tool_results == ["order 5: shipped", "order 5: shipped\n(You already made this exact call.)"]
    assert history[1]["tool_calls"][0]["id"] != history[3]["tool_calls"][0]["id"]  # ids unique per turn


def test_a_repeated_upstream_call_id_reaches_the_client_as_a_new_id(harness: Path, tmp_path: Path) -> None:
    """The upstream repeats its call id for the same call (the embedded backend's ids hash the call): the client
    gets a new id the second time, or a framework would skip the second call as already run."""
    upstream = Upstream(lambda m: ("", [{"id": "call_same", "name": "lookup_order", "arguments": '{"order_id": 5}'}]))
    proxy = build_proxy(harness, "scripted:test", store_dir=tmp_path / "store", upstream=upstream)
    history: list[dict[str, Any]] = [{"role": "user", "content": "where is order 5"}]
    ids = []
    with background(proxy) as base:
        sdk = client(base)
        for _ in range(2):
            call = sdk.chat.completions.create(model="m", tools=[LOOKUP], messages=history).choices[0].message
            ids.append(call.tool_calls[0].id)
            history.append(call.model_dump(exclude_none=True))
            history.append({"role": "tool", "tool_call_id": ids[-1], "content": "order 5: shipped"})
    assert ids[0] == "call_same" and ids[1] != "call_same"  # the upstream's id while it is new, then one of ours


def test_conversations_are_recorded_and_shown(harness: Path, tmp_path: Path) -> None:
    upstream = Upstream(lambda m: '{"name": "lookup_order", "arguments": {"order_id": "9"}}')
    store = tmp_path / "store"
    proxy = build_proxy(harness, "scripted:test", store_dir=store, upstream=upstream)
    with background(proxy) as base:
        sdk = client(base)
        first = [{"role": "user", "content": "order 9 please"}]
        raw = sdk.chat.completions.with_raw_response.create(model="m", tools=[LOOKUP], messages=first)
        conversation = raw.headers["x-ecdysis-conversation"]
        call = raw.parse().choices[0].message.tool_calls[0]
        second = first + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                          {"role": "tool", "tool_call_id": call.id, "content": "Error: order 9 not found"}]
        again = sdk.chat.completions.with_raw_response.create(model="m", tools=[LOOKUP], messages=second)
        assert again.headers["x-ecdysis-conversation"] == conversation  # derived from the prefix, stable
        ok = httpx.post(f"{base}/conversations/{conversation}/outcome", json={"passed": False, "note": "wrong"})
        assert ok.status_code == 200 and ok.json()["score"] == 0.0
        assert httpx.post(f"{base}/conversations/nope/outcome", json={"passed": True}).status_code == 404
        models = sdk.models.list()
        assert [m.id for m in models.data] == ["ecdysis-helpdesk-frozen"]
    runner = CliRunner()
    listed = runner.invoke(app, ["runs", "list", "--run-dir", str(store)])
    run_id = next(word for word in listed.output.split() if word.startswith("serve-"))
    shown = runner.invoke(app, ["show", run_id, "--run-dir", str(store)])
    assert shown.exit_code == 0, shown.output
    assert conversation in shown.output and "json_in_text" in shown.output and "coerce_types" in shown.output
    assert "fail" in shown.output
    as_json = json.loads(runner.invoke(app, ["show", run_id, "--run-dir", str(store), "--json"]).output)
    turns = as_json["conversations"][0]["turns"]
    assert len(turns) == 2 and turns[0]["repairs"] == ["json_in_text", "coerce_types"]
    assert turns[0]["prompt_tokens"] == 11 and turns[0]["overhead_ms"] >= 0
    html = tmp_path / "serve.html"
    assert runner.invoke(app, ["report", run_id, "--run-dir", str(store), "-o", str(html)]).exit_code == 0
    assert conversation in html.read_text()


def test_train_from_traces_proposes_h2_edit_verified_by_replay(tmp_path: Path) -> None:
    """Served without json_in_text: calls written as text reach the agent as text and those conversations
    fail; `train --from-traces` finds the pattern and verifies enabling the repair by replay."""
    harness = write_harness(tmp_path / "plain", repairs=[])

    def script(messages: list[Any]) -> Any:
        ask = next(m.content for m in messages if m.role == "user" and "status of order" in m.content)
        number = int(ask.split()[-1])
        if number % 2:  # odd orders: the model writes its call as JSON text
            return f'{{"name": "lookup_order", "arguments": {{"order_id": {number}}}}}'
        return "", [{"id": f"n{number}", "name": "lookup_order", "arguments": json.dumps({"order_id": number})}]

    store = tmp_path / "store"
    proxy = build_proxy(harness, "scripted:test", store_dir=store, upstream=Upstream(script))
    with background(proxy) as base:
        for number in (1, 2, 3, 4, 5):
            raw = client(base).chat.completions.with_raw_response.create(
                model="m", tools=[LOOKUP], messages=[{"role": "user", "content": f"status of order {number}"}])
            got_call = bool(raw.parse().choices[0].message.tool_calls)
            assert got_call == (number % 2 == 0)
            outcome = "pass" if got_call else "fail"  # the agent's own check, sent with its next request
            client(base, **{"X-Ecdysis-Outcome": outcome,
                            "X-Ecdysis-Conversation": raw.headers["x-ecdysis-conversation"]}
                   ).chat.completions.create(model="m", tools=[LOOKUP], messages=[
                       {"role": "user", "content": f"status of order {number}"},
                       {"role": "assistant", "content": raw.parse().choices[0].message.content or "ok"},
                       {"role": "user", "content": "thanks"}])
    out = tmp_path / "proposal"
    result = CliRunner().invoke(app, ["train", "--from-traces", str(store), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "traces_report.json").read_text())
    assert report["conversations"] == 5 and report["failing"] == 3
    h2 = [p for p in report["proposals"] if p["layer"] == "H2"]
    assert h2 and h2[0]["lever"] == "enable_repair json_in_text" and h2[0]["validated"]
    assert sorted(report["replay"]["changed"]) == sorted(report["patterns"][0]["conversations"])
    assert report["replay"]["lost"] == [] and report["replay"].get("changed_passing", []) == []
    assert json.loads((out / "harness" / "repairs.json").read_text()) == ["json_in_text"]
    assert "json_in_text" in result.output and "verified" in result.output


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_upstream_down_is_a_clear_502(harness: Path, tmp_path: Path) -> None:
    ref = f"http://127.0.0.1:{_closed_port()}/v1::somemodel"
    proxy = build_proxy(harness, ref, ServeSettings(upstream_retries=0, upstream_timeout_s=5),
                        store_dir=tmp_path / "store")
    with background(proxy) as base:
        start = time.perf_counter()
        with pytest.raises(openai.APIStatusError) as caught:
            client(base).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert time.perf_counter() - start < 5
    assert caught.value.status_code == 502
    assert "cannot reach" in caught.value.message and "somemodel" in caught.value.message


def test_limits_auth_and_bad_requests(harness: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_KEY", "s3cret-key")
    settings = ServeSettings(max_body_bytes=2000, api_key_env="SERVE_TEST_KEY")
    proxy = build_proxy(harness, "scripted:test", settings, upstream=Upstream(lambda m: "hello"))
    with background(proxy) as base:
        with pytest.raises(openai.AuthenticationError):
            client(base).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        sdk = openai.OpenAI(base_url=base, api_key="s3cret-key", max_retries=0)
        assert sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]
                                           ).choices[0].message.content == "hello"
        with pytest.raises(openai.APIStatusError) as big:
            sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 5000}])
        assert big.value.status_code == 413
        with pytest.raises(openai.BadRequestError):
            sdk.chat.completions.create(model="m", messages=[{"role": "function", "content": "x", "name": "f"}])


def test_serve_command_reports_a_harness_that_fails_to_load(tmp_path: Path) -> None:
    bad = write_harness(tmp_path / "bad")
    (bad / "regulate.py").write_text("def regulate(state):\n    return (\n")
    result = CliRunner().invoke(app, ["serve", "--harness", str(bad), "--upstream", "scripted:hi"])
    assert result.exit_code == 2
    assert "regulate.py" in result.output and "syntax error" in result.output
    (bad / "regulate.py").write_text("import no_such_module_here\n\ndef regulate(state):\n    return None\n")
    result = CliRunner().invoke(app, ["serve", "--harness", str(bad), "--upstream", "scripted:hi"])
    assert result.exit_code == 2
    assert "failed to load" in result.output and "no_such_module_here" in result.output


SNOOPING_REGULATE = '''import os

from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    if "boom" in state.observation:
        raise ValueError("regulate exploded")
    return Verdict(annotation="(key seen by harness code: " + os.environ.get("SERVE_TEST_SECRET", "none") + ")")
'''


def test_harness_code_runs_sandboxed_without_the_proxys_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.setenv("SERVE_TEST_SECRET", "sk-upstream-key-123")
    harness = write_harness(tmp_path / "h", [])
    (harness / "regulate.py").write_text(SNOOPING_REGULATE)
    upstream = Upstream(lambda m: "done")
    proxy = build_proxy(harness, "scripted:test", upstream=upstream)
    assert "bwrap" in proxy.harness.isolation or "rlimits" in proxy.harness.isolation
    history = [{"role": "user", "content": "order 1"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "a", "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": 1}'}}]},
               {"role": "tool", "tool_call_id": "a", "content": "shipped"}]
    with background(proxy) as base:
        client(base).chat.completions.create(model="m", tools=[LOOKUP], messages=history)
        with pytest.raises(openai.InternalServerError) as caught:
            client(base).chat.completions.create(model="m", tools=[LOOKUP], messages=[
                *history[:2], {"role": "tool", "tool_call_id": "a", "content": "boom"}])
        client(base).chat.completions.create(model="m", tools=[LOOKUP], messages=history)  # still serving
    tool = next(m for m in upstream.requests[0].messages if m.role == "tool")
    assert tool.content == "shipped\n(key seen by harness code: none)"
    assert "regulate exploded" in caught.value.message and "H4" in caught.value.message


def test_an_unseeded_sampled_request_gets_a_fresh_seed(harness: Path, tmp_path: Path) -> None:
    """The backends seed every call from its request; a client that asks again without a seed (OpenAI: random)
    must not get the same completion each time, and a client's own seed reaches the model unchanged."""
    upstream = Upstream(lambda m: "Hello.")
    proxy = build_proxy(harness, "scripted:test", store_dir=tmp_path / "store", upstream=upstream)
    asked = [{"role": "user", "content": "Say hello."}]
    with background(proxy) as base:
        for temperature, seed in ((0.8, None), (0.8, None), (0.8, 7), (0.0, None)):
            extra = {} if seed is None else {"seed": seed}
            client(base).chat.completions.create(model="m", messages=asked, temperature=temperature, **extra)
    seeds = [r.params.seed for r in upstream.requests]
    assert seeds[0] is not None and seeds[1] is not None and seeds[0] != seeds[1]
    assert seeds[2] == 7 and seeds[3] is None  # the client's own seed; greedy needs none
