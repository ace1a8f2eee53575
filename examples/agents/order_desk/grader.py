"""The order desk's grader: the orders the agent's tools placed must be exactly the gold orders."""


def grade(answer: str | None, gold: dict, state: dict) -> float:
    placed: dict[str, int] = {}
    for order in state.get("orders") or []:
        placed[order["item"]] = placed.get(order["item"], 0) + int(order["quantity"])
    return float(placed == gold["orders"])
