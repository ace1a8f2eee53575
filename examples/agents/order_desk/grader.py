"""The order desk's grader: the orders the agent's tools placed must be exactly the gold orders.

An episode whose program reported no state (it crashed, or timed out) scores 0 even when the gold is "order
nothing": not ordering because the agent fell over is not the same as deciding not to order."""


def grade(answer: str | None, gold: dict, state: dict) -> float:
    if "orders" not in state:
        return 0.0
    placed: dict[str, int] = {}
    for order in state["orders"]:
        placed[order["item"]] = placed.get(order["item"], 0) + int(order["quantity"])
    return float(placed == gold["orders"])
