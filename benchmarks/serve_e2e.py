"""End-to-end check of `ecdysis serve`: the openai SDK and an agent framework from PyPI (the OpenAI Agents SDK,
`openai-agents`, through its Chat Completions model), unmodified, against the proxy with the embedded model
upstream, tool calls included. Short: a few calls of at most --max-tokens tokens.

    .venv/bin/pip install 'ecdysis[serve-e2e]'
    .venv/bin/python benchmarks/serve_e2e.py [--upstream local:qwen2.5-coder-0.5b] [--max-tokens 96]
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def write_harness(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "harness.toml").write_text('name = "e2e"\nenv = "e2e"\ntool_calling = "native"\n\n[generation]\n'
                                       'max_tokens = 96\n\n[budget]\nmax_turns = 8\nmax_rejections = 1\n\n'
                                       '[files]\naction = ""\nregulate = ""\n')
    (root / "contract.md").write_text("Answer with the tools when a tool can answer. Tools:\n{tools}\n")
    (root / "skills.json").write_text(json.dumps([{"id": "w", "trigger": "weather temperature",
                                                   "tip": "Call get_weather with the city name."}]))
    (root / "demos.json").write_text("[]")
    (root / "repairs.json").write_text(json.dumps(["json_in_text", "coerce_types", "near_tool_name"]))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_sdk(base: str, max_tokens: int) -> dict:
    """A hand-written tool loop with the openai SDK: the call, its result, the final answer."""
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    start = time.perf_counter()
    first = client.chat.completions.create(model="e2e", messages=messages, tools=[WEATHER], max_tokens=max_tokens)
    calls = first.choices[0].message.tool_calls or []
    out = {"tool_calls": [(c.function.name, c.function.arguments) for c in calls], "final": None}
    if calls:
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C"} for c in calls]
        final = client.chat.completions.create(model="e2e", messages=messages, tools=[WEATHER],
                                               max_tokens=max_tokens)
        out["final"] = final.choices[0].message.content
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def with_agents_sdk(base: str, max_tokens: int) -> dict:
    """The OpenAI Agents SDK's own loop (Runner) with a function tool, on its Chat Completions model."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        called.append(city)
        return f"Sunny, 21 C in {city}"

    model = OpenAIChatCompletionsModel(model="e2e", openai_client=AsyncOpenAI(base_url=base, api_key="unused",
                                                                             max_retries=0, timeout=600))
    agent = Agent(name="weather", instructions="You answer weather questions.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(max_tokens=max_tokens, temperature=0.0))
    start = time.perf_counter()
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris right now?", max_turns=4))
    return {"tool_called_with": called, "final": result.final_output, "seconds": round(time.perf_counter() - start, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", default="local:qwen2.5-coder-0.5b")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryDirectory(prefix="serve-e2e-") as tmp:
        store = Path(tmp) / "store"
        proc = subprocess.Popen([str(Path(sys.executable).with_name("ecdysis")), "serve", "--harness",
                                 str(write_harness(Path(tmp) / "harness")), "--upstream", args.upstream,
                                 "--port", str(port), "--store", str(store), "--log-level", "info"],
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            import httpx

            for _ in range(600):
                try:
                    httpx.get(f"{base[:-3]}/health", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            results = {"openai_sdk": with_sdk(base, args.max_tokens)}
            print("openai SDK:", json.dumps(results["openai_sdk"]), flush=True)
            results["openai_agents"] = with_agents_sdk(base, args.max_tokens)
            print("openai-agents:", json.dumps(results["openai_agents"]), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=600)
        subprocess.run([str(Path(sys.executable).with_name("ecdysis")), "show", "--run-dir", str(store)], check=False)
    ok = bool(results["openai_sdk"]["tool_calls"]) and bool(results["openai_agents"]["tool_called_with"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
