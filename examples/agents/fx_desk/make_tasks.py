"""Writes tasks.jsonl: convert an amount between two currencies at today's (made-up, per task) rates, which only
the agent's `exchange_rate` tool knows. Gold: the converted amount (graded `numeric` within 1%).
Deterministic (seeded): `python make_tasks.py` rewrites the same file."""

import json
import random
from pathlib import Path

BASE = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.88, "CAD": 1.37, "SEK": 10.6, "INR": 83.3}
SPLITS = ["train"] * 12 + ["val"] * 8 + ["test"] * 12


def main() -> None:
    rng = random.Random(11)
    rows = []
    for i, split in enumerate(SPLITS):
        rates = {c: round(v * rng.uniform(0.8, 1.25), 4) if c != "USD" else 1.0 for c, v in BASE.items()}
        source, target = rng.sample(sorted(rates), 2)
        amount = rng.choice([20, 75, 120, 250, 480, 1000, 1350])
        value = amount * rates[target] / rates[source]
        rows.append({"id": f"fx-{i:02d}", "split": split, "public": {"rates": rates},
                     "prompt": f"How much is {amount} {source} in {target} at today's rate?",
                     "answer": round(value, 2)})
    Path(__file__).with_name("tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
