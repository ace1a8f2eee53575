"""The example agent programs (examples/agents/) run through the endpoint against a scripted upstream: the OpenAI
Agents SDK order desk and the LangGraph currency desk, each set up with `ecdysis init --agent` as its README
says, each passing with a model that uses their tools right and failing with one that does not."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.workspace import Workspace

pytest.importorskip("fastapi")
EXAMPLES = Path(__file__).parents[1] / "examples" / "agents"


def init_example(name: str, tmp_path: Path, grader: str, *more: str) -> Path:
    """A copy of the example, initialised with the command its README gives."""
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run([sys.executable, "-m", "ecdysis", "init", ".", "--agent", "python agent.py", "--env",
                           "jsonl", "--tasks", "tasks.jsonl", "--grader", grader, *more], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return folder


async def run_example(folder: Path, responder, name: str, n: int = 3) -> list:
    cfg = load_config(folder / "ecdysis.toml", ['agent.model="scripted:up"', "run.progress=false",
                                                f'cache.path="{folder / "cache.sqlite"}"', "sandbox.timeout_s=120"])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:up"] = ScriptedModel(responder, name=name)  # its own cache entries and run
    ws.store.start_run("eval", {}, run_id=name)
    summary = await ws.runner(name).evaluate(ws.harness(), ws.tasks("train", n), 1, "train", "eval")
    trajectories = ws.store.trajectories(summary.eval_id)
    ws.close()
    return trajectories


def _results(messages: list[Message]) -> list[str]:
    return [m.content for m in messages if m.role == "tool"]


def clerk(messages: list[Message]) -> str | dict:
    """Checks the stock of every item asked for, orders min(asked, stock) of those in stock, then says so."""
    user = next(m.content for m in messages if m.role == "user")
    wanted = {name.rstrip("s"): int(q) for q, name in re.findall(r"(\d+) ([a-z]+)", user)}
    results = _results(messages)
    units = {m.group(2): int(m.group(1)) for r in results if (m := re.match(r"(\d+) unit\(s\) of (\w+)", r))}
    ordered = {m.group(1) for r in results if (m := re.match(r"Ordered \d+ (\w+)", r))}
    unchecked = [n for n in wanted if n not in units]
    if unchecked:
        return {"text": "", "tool_calls": [{"name": "check_stock", "arguments": {"item": n}} for n in unchecked]}
    todo = [n for n in wanted if units[n] > 0 and n not in ordered]
    if todo:
        return {"text": "", "tool_calls": [{"name": "place_order", "arguments": {"item": n, "quantity":
                                                                               min(wanted[n], units[n])}}
                                           for n in todo]}
    return "Your order is placed."


def hasty_clerk(messages: list[Message]) -> str | dict:
    """Orders what was asked without checking the stock (the tool refuses what is not there)."""
    user = next(m.content for m in messages if m.role == "user")
    if not _results(messages):
        return {"text": "", "tool_calls": [{"name": "place_order", "arguments": {"item": n, "quantity": int(q)}}
                                           for q, n in re.findall(r"(\d+) ([a-z]+)", user)]}
    return "Done."


def fx_dealer(messages: list[Message]) -> str | dict:
    """Asks for the rate, multiplies with the tool, answers with the product."""
    user = next(m.content for m in messages if m.role == "user")
    amount, source, target = re.search(r"How much is (\d+) (\w+) in (\w+)", user).groups()
    results = _results(messages)
    if not results:
        return {"text": "", "tool_calls": [{"name": "exchange_rate", "arguments": {"source": source,
                                                                                   "target": target}}]}
    if len(results) == 1:
        rate = float(re.search(r"= ([\d.e+-]+)", results[0]).group(1))
        return {"text": "", "tool_calls": [{"name": "multiply", "arguments": {"a": float(amount), "b": rate}}]}
    return results[-1]


async def test_openai_agents_sdk_order_desk(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    folder = init_example("order_desk", tmp_path, "grader.py:grade")
    good = await run_example(folder, clerk, "clerk")
    assert [t.termination for t in good] == ["answered"] * 3 and all(t.passed for t in good), [
        (t.traceback, t.final_state) for t in good]
    assert all("orders" in t.final_state for t in good)
    assert any(e["tool"] == "check_stock" for t in good for e in t.of_kind("action"))
    hasty = await run_example(folder, hasty_clerk, "hasty", n=4)
    tasks = {json.loads(line)["id"]: json.loads(line) for line in (folder / "tasks.jsonl").read_text().splitlines()}

    def orders_right(task: dict) -> bool:  # an order for more than the stock is refused whole by the tool
        stock = task["public"]["stock"]
        return all(stock[n.rstrip("s")]["units"] == 0 or int(q) <= stock[n.rstrip("s")]["units"]
                   for q, n in re.findall(r"(\d+) ([a-z]+)", task["prompt"]))

    expected = [orders_right(tasks[t.task_id]) for t in hasty]
    assert [t.passed for t in hasty] == expected and not all(expected)  # the state the tools changed decides


async def test_langgraph_currency_desk(tmp_path: Path) -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    folder = init_example("fx_desk", tmp_path, "numeric", "--set", "env.options.tolerance=0.01")
    assert 'grader = "numeric", tolerance = 0.01 }' in (folder / "ecdysis.toml").read_text()
    good = await run_example(folder, fx_dealer, "dealer")
    assert all(t.passed for t in good), [(t.final_answer, t.traceback) for t in good]
    assert [e["tool"] for e in good[0].of_kind("action")] == ["exchange_rate", "multiply", "answer"]
    guess = await run_example(folder, lambda messages: "About 100.", "guess")
    assert not any(t.passed for t in guess) and all(t.termination == "answered" for t in guess)
