"""How reliably the embedded catalog models make tool calls (first turn of every helpdesk ticket).

    .venv/bin/python benchmarks/tool_call_reliability.py [--models smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b]

For each model and each `tool_choice` ("auto": the model's own chat template renders the tools and
we parse its reply; "required": grammar-constrained JSON), counts replies that carry a call, and
calls whose arguments validate against the tool's JSON schema. No response cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from ecdysis.harness.api import ToolCall
from ecdysis.harness.tool_calls import action_of, openai_tools, validate
from ecdysis.models import ChatRequest, GenerationParams, Message, build_model

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "helpdesk"
sys.path.insert(0, str(EXAMPLE))
from helpdesk_env import TOOLS  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    args = parser.parse_args()
    policy = (EXAMPLE / "policy.md").read_text()
    tickets = [json.loads(line)["request"] for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()]
    print(f"{len(tickets)} helpdesk tickets, first turn, greedy, max_tokens 120")
    print(f"{'model':22} {'tool_choice':11} {'with call':>9} {'valid args':>10} {'s/call':>7}")
    for name in args.models.split(","):
        model = build_model(f"local:{name}")
        for choice in ("auto", "required"):
            with_call = valid = 0
            start = time.perf_counter()
            for ticket in tickets:
                request = ChatRequest(messages=[Message(role="system", content=policy),
                                                Message(role="user", content=ticket)],
                                      params=GenerationParams(max_tokens=120, tools=openai_tools(TOOLS),
                                                              tool_choice=choice))
                response = await model.chat(request)
                if response.tool_calls:
                    with_call += 1
                    c = response.tool_calls[0]
                    valid += validate(action_of(ToolCall(c.id, c.name, c.arguments), TOOLS), TOOLS) is None
            per = (time.perf_counter() - start) / len(tickets)
            print(f"{name:22} {choice:11} {with_call:>5}/{len(tickets):<3} {valid:>6}/{len(tickets):<3} {per:7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
