"""A currency-desk agent written with LangGraph and langchain-openai, the way LangGraph's docs write one: a
`StateGraph` over `MessagesState`, a model node with tools bound, a `ToolNode`, and `tools_condition` between.

Its tools run here: `exchange_rate` reads today's rates (this task's, in `public`: the model cannot know them)
and `multiply` does the arithmetic. Under Ecdysis the task comes in `ECDYSIS_TASK`, the model is reached
through `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the endpoint that applies the harness), and the last line printed
is the answer (graded as a number). Outside Ecdysis: `python agent.py '{"prompt": "...", "public": {...}}'`.
"""

import json
import os
import sys

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

task = json.loads(os.environ.get("ECDYSIS_TASK") or sys.argv[1])
RATES: dict[str, float] = task["public"]["rates"]  # units of each currency per 1 USD, today


@tool
def exchange_rate(source: str, target: str) -> str:
    """Today's exchange rate: how many units of `target` one unit of `source` buys (ISO codes, e.g. EUR, JPY)."""
    a, b = source.strip().upper(), target.strip().upper()
    missing = [c for c in (a, b) if c not in RATES]
    if missing:
        return f"Error: unknown currency {missing[0]!r}; known: {', '.join(sorted(RATES))}."
    return f"1 {a} = {RATES[b] / RATES[a]:.6g} {b}"


@tool
def multiply(a: float, b: float) -> str:
    """Multiply two numbers exactly."""
    return f"{a * b:.6g}"


tools = [exchange_rate, multiply]
model = ChatOpenAI(model=os.environ.get("ECDYSIS_MODEL", "gpt-4o-mini"), temperature=0).bind_tools(tools)
SYSTEM = ("You are a currency desk. Use exchange_rate to get today's rate and multiply to convert the amount. "
          "Reply with the converted amount as a number only.")


def call_model(state: MessagesState) -> dict:
    return {"messages": [model.invoke([SystemMessage(SYSTEM), *state["messages"]])]}


builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_node("tools", ToolNode(tools))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")
graph = builder.compile()

if __name__ == "__main__":
    final = graph.invoke({"messages": [("user", task["prompt"])]}, {"recursion_limit": 12})
    print(str(final["messages"][-1].content).strip().splitlines()[-1] if final["messages"][-1].content else "")
