"""Price table (USD per million tokens) for hosted models; local and unknown models cost 0."""

from __future__ import annotations

from .base import Usage

# (input, cached input, output) per 1M tokens. Extend by config if you use other hosted models.
PRICES_PER_MTOK: dict[str, tuple[float, float, float]] = {
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "gpt-4o": (2.50, 1.25, 10.0),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "deepseek-chat": (0.27, 0.07, 1.10),
}


def cost_usd(model_name: str, usage: Usage, table: dict[str, tuple[float, float, float]] | None = None) -> float:
    prices = (table or PRICES_PER_MTOK).get(model_name)
    if prices is None:
        return 0.0
    inp, cached, out = prices
    fresh = max(usage.prompt_tokens - usage.cached_tokens, 0)
    return (fresh * inp + usage.cached_tokens * cached + usage.completion_tokens * out) / 1e6
