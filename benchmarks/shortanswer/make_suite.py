"""A short-answer reasoning suite none of the built-in parsers was written for (issue 10's third suite).

    python benchmarks/shortanswer/make_suite.py OUT.jsonl [--per-family 8]

Six task families with short answers: arithmetic and unit conversions (numbers), number facts
(True/False), comparisons (Yes/No), the largest of three (option letter) and number sequences
(numbers). Deterministic (seeded); splits are assigned by the suite (half train, a quarter val,
a quarter test per family). Grade with `grader.py:grade` next to this file.
"""

from __future__ import annotations

import argparse
import json
import random


def families(rng: random.Random) -> dict[str, tuple[str, str]]:
    a, b, c = rng.randint(12, 60), rng.randint(3, 9), rng.randint(2, 6)
    n = rng.choice([21, 23, 27, 29, 31, 33, 37, 39, 41, 49, 51, 53, 57, 59, 61])
    prime = all(n % d for d in range(2, int(n ** 0.5) + 1))
    p, q, r, s = rng.randint(1, 9), rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 12)
    options = rng.sample(range(10, 99), 3)
    start, step = rng.randint(2, 20), rng.randint(3, 9)
    hours = rng.randint(2, 9)
    return {
        "arithmetic": (f"A shop has {a} apples. It sells {b} bags of {c} apples each. How many apples are left?",
                       str(a - b * c)),
        "number_fact": (f"True or False: {n} is a prime number.", "True" if prime else "False"),
        "comparison": (f"Is {p}/{q} larger than {r}/{s}? Answer Yes or No.",
                       "Yes" if p / q > r / s else "No"),
        "largest": (f"Which number is the largest? (A) {options[0]} (B) {options[1]} (C) {options[2]}",
                    "ABC"[options.index(max(options))]),
        "sequence": (f"What number comes next: {start}, {start + step}, {start + 2 * step}, {start + 3 * step}, ?",
                     str(start + 4 * step)),
        "conversion": (f"How many minutes are there in {hours} hours and {c * 5} minutes?",
                       str(hours * 60 + c * 5)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--per-family", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(7)
    rows = []
    for i in range(args.per_family):
        split = "train" if i < args.per_family // 2 else "val" if i < 3 * args.per_family // 4 else "test"
        for family, (prompt, answer) in families(rng).items():
            rows.append({"id": f"{family}-{i}", "prompt": prompt, "answer": answer, "split": split})
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {len(rows)} tasks to {args.out}")


if __name__ == "__main__":
    main()
