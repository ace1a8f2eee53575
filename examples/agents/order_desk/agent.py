"""An order-desk agent written with the OpenAI Agents SDK, the way the SDK's docs write one.

Two tools of its own run here, in the agent's process, over the shop's stock for this task: `check_stock` and
`place_order`. Under Ecdysis the task comes in `ECDYSIS_TASK` (its prompt, and the stock in `public`), the model
is reached through `OPENAI_BASE_URL` / `OPENAI_API_KEY` (the endpoint that applies the harness), and the
orders the tools placed are reported as the final state (`ECDYSIS_RESULT`), which the grader checks.
Outside Ecdysis: `python agent.py '{"prompt": "...", "public": {"stock": {...}}}'` with your own key.
"""

import json
import os
import sys

from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_api, set_tracing_disabled

set_default_openai_api("chat_completions")  # the endpoint speaks Chat Completions
set_tracing_disabled(True)

task = json.loads(os.environ.get("ECDYSIS_TASK") or sys.argv[1])
stock: dict[str, dict] = {name: dict(item) for name, item in task["public"]["stock"].items()}
orders: list[dict] = []


@function_tool
def check_stock(item: str) -> str:
    """How many units of an item are in stock, and its price.

    Args:
        item: the item's name, e.g. "mug".
    """
    found = stock.get(item.strip().lower().rstrip("s")) or stock.get(item.strip().lower())
    if found is None:
        return f"Error: we do not sell {item!r}. Items: {', '.join(sorted(stock))}."
    return f"{found['units']} unit(s) of {item} in stock at ${found['price']:.2f} each."


@function_tool
def place_order(item: str, quantity: int) -> str:
    """Order units of an item for the customer (at most the units in stock).

    Args:
        item: the item's name.
        quantity: how many units to order.
    """
    key = item.strip().lower().rstrip("s") if item.strip().lower().rstrip("s") in stock else item.strip().lower()
    if key not in stock:
        return f"Error: we do not sell {item!r}."
    if quantity <= 0 or quantity > stock[key]["units"]:
        return f"Error: cannot order {quantity} {item}: {stock[key]['units']} in stock."
    stock[key]["units"] -= quantity
    orders.append({"item": key, "quantity": quantity})
    return f"Ordered {quantity} {key} (order #{len(orders)})."


agent = Agent(
    name="Order desk",
    instructions=("You take customer orders for a small shop. For every item the customer asks for, check the "
                  "stock, then order the quantity asked for, or all the units in stock if there are fewer. Do not "
                  "order items that are out of stock. Then tell the customer in one sentence what was ordered."),
    tools=[check_stock, place_order],
    model=os.environ.get("ECDYSIS_MODEL", "gpt-4o-mini"),
    model_settings=ModelSettings(temperature=0.0),
)

if __name__ == "__main__":
    result = Runner.run_sync(agent, task["prompt"], max_turns=12)
    answer = {"answer": str(result.final_output), "state": {"orders": orders}}
    if os.environ.get("ECDYSIS_RESULT"):
        with open(os.environ["ECDYSIS_RESULT"], "w") as f:
            json.dump(answer, f)
    print(result.final_output)
