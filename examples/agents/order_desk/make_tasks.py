"""Writes tasks.jsonl: a customer asks for a few items; the stock (in each task's `public`) decides what can be
ordered. Gold: the orders an exact clerk places (the quantity asked, capped at the stock; none when out of stock).
Deterministic (seeded): `python make_tasks.py` rewrites the same file."""

import json
import random
from pathlib import Path

ITEMS = {"mug": 6.5, "notebook": 3.25, "pen": 1.2, "lamp": 24.0, "scarf": 15.0, "kettle": 32.0, "candle": 7.75,
         "poster": 9.0}
SPLITS = ["train"] * 12 + ["val"] * 8 + ["test"] * 12


def main() -> None:
    rng = random.Random(7)
    rows = []
    for i, split in enumerate(SPLITS):
        names = rng.sample(sorted(ITEMS), 5)
        stock = {n: {"units": rng.choice([0, 0, 1, 2, 3, 5, 8]), "price": ITEMS[n]} for n in names}
        wanted = {n: rng.randint(1, 4) for n in rng.sample(names, rng.choice([1, 2, 2, 3]))}
        asks = " and ".join(f"{q} {n}{'s' if q > 1 else ''}" for n, q in wanted.items())
        gold = {n: min(q, stock[n]["units"]) for n, q in wanted.items() if stock[n]["units"] > 0}
        rows.append({"id": f"order-{i:02d}", "split": split, "prompt": f"Hi, I would like {asks}, please.",
                     "public": {"stock": stock}, "answer": {"orders": gold}})
    Path(__file__).with_name("tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
