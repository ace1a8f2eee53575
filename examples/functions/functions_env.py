"""An Ecdysis environment plugin where every task brings its own functions (an example, like a user's own).

Each request comes with a small set of functions of its own (names and parameters vary from task to task);
the agent answers by calling the right ones with the right arguments, several at once where the request
needs several (weather in two cities, two stock prices). Graded in the host on the calls made: the
multiset of (function, arguments) must equal the expected one (numbers by value, strings ignoring case).
The episode ends itself after the first turn that made calls (`done`).

    ecdysis init myfunctions --env functions_env:environment    (run from this folder, or set env.plugin_path)
    ecdysis eval -c myfunctions/ecdysis.toml --split val
    ecdysis train -c myfunctions/ecdysis.toml

48 tasks are generated here, deterministically: 6 kinds x 8 (per kind 4 train, 2 val, 2 test); the kind
is `task.meta["type"]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecdysis.envs.base import Score, Task, check_split, stable_id
from ecdysis.harness.api import Action, ToolSpec

INSTRUCTIONS = ("You are a function-calling assistant. Each request comes with its own functions. Do what the "
                "request asks by calling the right function(s) with the right arguments.")
CITIES = ["Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dublin", "Hanoi"]
SYMBOLS = ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "GOOG", "META", "INTC"]
CURRENCIES = [("USD", "EUR"), ("GBP", "JPY"), ("EUR", "CHF"), ("CAD", "USD"), ("AUD", "NZD"), ("USD", "MXN"),
              ("SEK", "NOK"), ("INR", "USD")]
EVENTS = ["team sync", "dentist", "project review", "gym", "lunch with Ana", "budget call", "1:1", "demo day"]


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _weather(name: str, city: str, unit: str) -> ToolSpec:
    return ToolSpec(name, "Current weather for a city.", _obj(
        {city: {"type": "string", "description": "City name"},
         unit: {"type": "string", "enum": ["celsius", "fahrenheit"]}}, [city, unit]))


def _kinds(i: int) -> list[tuple[str, str, list[ToolSpec], list[dict[str, Any]]]]:
    """The six task kinds for index i: (kind, request, functions offered, expected calls)."""
    w_name, w_city, w_unit = [("get_weather", "city", "unit"), ("weather_now", "location", "units"),
                              ("current_conditions", "place", "scale")][i % 3]
    weather = _weather(w_name, w_city, w_unit)
    unit = ["celsius", "fahrenheit"][i % 2]
    a, b = CITIES[i], CITIES[(i + 3) % 8]
    s_name, s_arg = [("get_stock_price", "symbol"), ("quote", "ticker"), ("stock_quote", "symbol")][i % 3]
    stock = ToolSpec(s_name, "Latest price of one stock.", _obj({s_arg: {"type": "string"}}, [s_arg]))
    c_name = ["convert_currency", "fx_convert", "exchange"][i % 3]
    currency = ToolSpec(c_name, "Convert an amount between currencies.", _obj(
        {"amount": {"type": "number"}, "from_currency": {"type": "string"}, "to_currency": {"type": "string"}},
        ["amount", "from_currency", "to_currency"]))
    e_name = ["create_event", "add_to_calendar", "schedule"][i % 3]
    event = ToolSpec(e_name, "Add an event to the calendar.", _obj(
        {"title": {"type": "string"}, "date": {"type": "string", "description": "YYYY-MM-DD"},
         "duration_minutes": {"type": "integer"}}, ["title", "date", "duration_minutes"]))
    m_name = ["multiply", "product", "mul"][i % 3]
    mul = ToolSpec(m_name, "Multiply two integers.", _obj({"a": {"type": "integer"}, "b": {"type": "integer"}},
                                                          ["a", "b"]))
    x, y = 100 + 37 * i, 200 + 53 * i
    amount = 25 * (i + 1)
    frm, to = CURRENCIES[i]
    day = f"2026-0{1 + i % 9}-{10 + i:02d}"
    minutes = [30, 45, 60, 90][i % 4]
    return [
        ("weather", f"What is the weather in {a} right now, in {unit}?", [weather, stock],
         [{"name": w_name, "arguments": {w_city: a, w_unit: unit}}]),
        ("weather_pair", f"Compare the current weather in {a} and in {b} ({unit}).", [weather, currency],
         [{"name": w_name, "arguments": {w_city: a, w_unit: unit}},
          {"name": w_name, "arguments": {w_city: b, w_unit: unit}}]),
        ("currency", f"How much is {amount} {frm} in {to}?", [currency, mul],
         [{"name": c_name, "arguments": {"amount": amount, "from_currency": frm, "to_currency": to}}]),
        ("calendar", f"Put '{EVENTS[i]}' in my calendar on {day} for {minutes} minutes.", [event, weather],
         [{"name": e_name, "arguments": {"title": EVENTS[i], "date": day, "duration_minutes": minutes}}]),
        ("math", f"compute {x} * {y}", [mul, currency], [{"name": m_name, "arguments": {"a": x, "b": y}}]),
        ("stock_pair", f"Get me the latest prices of {SYMBOLS[i]} and {SYMBOLS[(i + 5) % 8]}.", [stock, event],
         [{"name": s_name, "arguments": {s_arg: SYMBOLS[i]}},
          {"name": s_name, "arguments": {s_arg: SYMBOLS[(i + 5) % 8]}}]),
    ]


def all_tasks() -> list[Task]:
    out = []
    for i in range(8):
        split = ("train", "train", "val", "train", "test", "train", "val", "test")[i]
        for kind, request, tools, calls in _kinds(i):
            out.append(Task(id=stable_id("fn", kind, request), split=split, prompt=request, gold=calls,
                            public={"tools": [t.to_record() for t in tools]}, meta={"type": kind}))
    return out


def _norm(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            return float(text)
        except ValueError:
            return text
    return value


def _key(call: dict[str, Any]) -> str:
    args = call.get("arguments") or {}
    return json.dumps([call.get("name"), {k: _norm(v) for k, v in sorted(args.items())}])


class FunctionsEpisode:
    """Sandbox side: the task's own functions; every call is recorded and answered with a small result."""

    task_tools = True  # the tools come with the task: a harness's tool list does not filter them

    def __init__(self, public: dict[str, Any]) -> None:
        self.tools = tuple(ToolSpec.from_record(t) for t in public.get("tools", []))
        self.calls: list[dict[str, Any]] = []
        self.done = False

    def step(self, action: Action) -> str:
        self.calls.append({"name": action.tool, "arguments": action.arguments or {}})
        self.done = True  # the request is answered by the calls of one turn
        return json.dumps({"status": "ok", "function": action.tool})

    def final_state(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def close(self) -> None:
        return None


@dataclass
class Functions:
    """Host side: tasks, grading on the calls made."""

    name: str = "functions_env:environment"
    tools: tuple[ToolSpec, ...] = ()  # no shared tools: each task brings its own
    task_tools: bool = True
    parallel_calls: bool = True  # some tasks need several calls in one turn
    ends_itself: bool = True  # an episode ends after the turn that made calls (no final reply to write)
    tool_calling: str = "native"
    max_turns: int = 2
    instructions: str = INSTRUCTIONS
    tool_names: tuple[str, ...] = field(default_factory=lambda: tuple(sorted(
        {t["name"] for task in all_tasks() for t in task.public["tools"]})))

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in all_tasks() if t.split == split]

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        made = sorted(_key(c) for c in final_state.get("calls", []))
        want = sorted(_key(c) for c in task.gold)
        ok = made == want
        detail = "calls match" if ok else f"made {len(made)} call(s), expected {len(want)}; " + (
            "some differ" if made else "no call made")
        return Score(float(ok), ok, detail, {"calls_made": len(made), "calls_expected": len(want)})


def environment(data_dir: Path | None = None, seed: int = 0, **options: Any) -> Functions:
    """The plugin's factory (`env.name = "functions_env:environment"`)."""
    if options:
        raise ValueError(f"functions_env takes no options, got {sorted(options)}")
    return Functions()


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> FunctionsEpisode:
    return FunctionsEpisode(public)
