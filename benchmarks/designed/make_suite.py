"""The designed suite of issue 38: short-answer tasks with a known failure structure (README.md pre-registers
the experiment run on it).

    python benchmarks/designed/make_suite.py OUT.jsonl [--per-seed 24,40,40] [--seeds 8] [--pool 2]
        [--kinds OUT.kinds.json]

Kinds (the share of every split; `--kinds` writes each task's kind beside the suite, for analysis only: the
suite itself carries no kind, so no optimizer sees one):

- `boxed` (17%): arithmetic whose prompt asks for step-by-step work and a boxed result (\\boxed{42}); the
  seed accepts only a final `Answer: ...` line.                                    harness-level (H2/H3)
- `units` (17%): totals in the thousands with a unit ("in dollars", "bottles"); the grader wants the plain
  number, no thousands separators, no unit.                                        harness-level (H2/H3)
- `answer_first` (17%): the prompt asks for the answer first and a one-sentence reason after it, so the
  last line is not the answer.                                                     harness-level (H2/H3)
- `labels` (17%): classification into a declared lower-case label set (`choices`); the grader wants the
  label exactly (`Positive`, `positive.` fail).                                    harness-level (H2 answer_set)
- `hard` (12%): three-digit by three-digit products; a 1.5B model gets most wrong whatever the harness does.
                                                                                   model-level
- `plain` (12%): easy questions in the seed's own format (what the seed already passes).
- `quirk` (8%): one-off demands (Roman numerals, the answer spelled out, reversed...), each kind of demand
  rare: a per-failure search is tempted to add a rule for each.                    isolated quirks

Pools: every split holds `pool` x `seeds` x its per-seed size, so two seeds' draws share about 1/(pool x seeds)
of their tasks. Deterministic (seeded by `--suite-seed`); grade with `grader.py:grade` beside this file.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable

Task = tuple[str, object, list[str] | None]  # prompt, gold, choices
SHARES = {"boxed": 17, "units": 17, "answer_first": 17, "labels": 17, "hard": 12, "plain": 12, "quirk": 8}
HARNESS_KINDS = ("boxed", "units", "answer_first", "labels")

ITEMS = [("apples", "crates"), ("bottles", "cases"), ("pencils", "boxes"), ("tiles", "pallets"), ("books", "shelves"),
         ("bolts", "bins"), ("eggs", "cartons"), ("chairs", "rows"), ("seeds", "packets"), ("cups", "trays")]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "June", "Kofi", "Lena", "Mo", "Nia"]


def num(value: int) -> dict[str, object]:
    return {"type": "number", "value": value}


def boxed(rng: random.Random) -> Task:
    a, b, c = rng.randint(12, 95), rng.randint(2, 9), rng.randint(3, 40)
    name, (item, _) = rng.choice(NAMES), rng.choice(ITEMS)
    form = rng.randrange(3)
    if form == 0:
        text = f"{name} has {a} {item}, buys {b} more packs of {c} and gives away {b + c}. How many {item} now?"
        value = a + b * c - (b + c)
    elif form == 1:
        text = f"What is {a} + {b} * {c}?"
        value = a + b * c
    else:
        text = f"{name} reads {c} pages a day for {b} days, then {a} pages more. How many pages in all?"
        value = b * c + a
    return f"{text} Solve it step by step and box the final answer like \\boxed{{42}}.", num(value), None


def units(rng: random.Random) -> Task:
    (item, group), n, per = rng.choice(ITEMS), rng.randint(120, 980), rng.randint(12, 48)
    form = rng.randrange(3)
    if form == 0:
        return f"A warehouse has {n} {group} with {per} {item} in each. How many {item} are there in total?", \
            num(n * per), None
    if form == 1:
        price = rng.randint(15, 95)
        return f"A shop sells {n} {item} at ${price} each. What is the total revenue in dollars?", num(n * price), None
    km = rng.randint(3, 9)
    return f"A runner trains {per} minutes a day for {n} days and covers {km} km per session. How many meters " \
           "did the runner cover in total?", num(n * km * 1000), None


def answer_first(rng: random.Random) -> Task:
    a, b = rng.randint(20, 90), rng.randint(2, 12)
    form = rng.randrange(3)
    if form == 0:
        text, value = f"How many minutes are in {b} hours and {a - 15} minutes?", b * 60 + a - 15
    elif form == 1:
        text, value = f"A bus seats {a} people. How many people fit in {b} buses?", a * b
    else:
        text, value = f"{rng.choice(NAMES)} had {a + 3 * b} stickers and gave {b} to each of 3 friends. How many " \
                      "are left?", a
    return f"{text} Give the answer first, then explain your reasoning in one sentence.", num(value), None


SENTIMENT = {"positive": ["loved", "enjoyed", "was delighted by", "would gladly recommend", "was impressed by",
                          "keep going back to"],
             "negative": ["hated", "regretted buying", "was disappointed by", "would never recommend", "gave up on",
                          "was annoyed by"],
             "neutral": ["received", "used once", "have no strong opinion about", "saw", "walked past", "read about"]}
THINGS = ["the blender", "this hotel", "the new phone", "the pasta place", "this novel", "the museum tour",
          "the train service", "this jacket", "the concert", "the coffee maker", "this app", "the bike shop",
          "the dentist", "this laptop", "the bakery", "the city park", "this game", "the airline", "the gym",
          "this podcast", "the ferry", "the bookshop", "this camera", "the tea house"]
CATEGORIES = {"fruit": ["mango", "pear", "plum", "kiwi", "apricot", "cherry", "fig", "lime", "papaya", "guava",
                        "lychee", "quince"],
              "vegetable": ["carrot", "leek", "spinach", "cabbage", "radish", "celery", "kale", "turnip", "okra",
                            "parsnip", "fennel", "artichoke"],
              "grain": ["barley", "oats", "rye", "millet", "quinoa", "sorghum", "rice", "wheat", "spelt", "teff",
                        "buckwheat", "amaranth"]}
ANIMALS = {"mammal": ["otter", "badger", "lynx", "walrus", "bison", "hedgehog", "lemur", "mole"],
           "bird": ["heron", "finch", "puffin", "kestrel", "wren", "ibis", "crane", "magpie"],
           "reptile": ["gecko", "iguana", "python", "tortoise", "skink", "caiman", "cobra", "chameleon"]}


def labels(rng: random.Random) -> Task:
    form = rng.random()
    if form < 0.6:
        label = rng.choice(sorted(SENTIMENT))
        verb = rng.choice(SENTIMENT[label])
        return (f"Classify the sentiment of this review as positive, negative or neutral.\n"
                f"Review: \"I {verb} {rng.choice(THINGS)}.\""), {"type": "label", "value": label}, sorted(SENTIMENT)
    table, question = (CATEGORIES, "Is {w} a fruit, a vegetable or a grain? Answer with the category.") \
        if form < 0.8 else (ANIMALS, "Is the {w} a mammal, a bird or a reptile? Answer with the class.")
    label = rng.choice(sorted(table))
    return question.format(w=rng.choice(table[label])), {"type": "label", "value": label}, sorted(table)


def hard(rng: random.Random) -> Task:
    a, b = rng.randint(213, 987), rng.randint(213, 987)
    return f"What is {a} * {b}?", num(a * b), None


def plain(rng: random.Random) -> Task:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    form = rng.randrange(3)
    if form == 0:
        return f"What is {a} + {b}?", num(a + b), None
    if form == 1:
        return f"What is {max(a, b)} - {min(a, b)}?", num(max(a, b) - min(a, b)), None
    return f"What is {a} times 2?", num(2 * a), None


ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
         (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
        "seventeen eighteen nineteen twenty".split()


def roman(n: int) -> str:
    out = ""
    for value, letters in ROMAN:
        while n >= value:
            out, n = out + letters, n - value
    return out


def quirk(rng: random.Random) -> Task:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    word = rng.choice(["harness", "sandbox", "episode", "verdict", "lattice", "compass", "thunder", "marble"])
    demands: list[Callable[[], Task]] = [
        lambda: (f"What is {a} + {b}? Write the answer in Roman numerals.", {"type": "text", "value": roman(a + b)},
                 None),
        lambda: (f"What is {a} + {b}? Spell the answer out in English words.", {"type": "text", "value": WORDS[a + b]},
                 None),
        lambda: (f"Write the word '{word}' backwards.", {"type": "text", "value": word[::-1]}, None),
        lambda: (f"What is {a} * {b}, plus one? Answer with the number in parentheses, like (7).",
                 {"type": "text", "value": f"({a * b + 1})"}, None),
        lambda: (f"Which letter comes {a} places after 'c' in the alphabet? Answer in upper case.",
                 {"type": "text", "value": chr(ord("c") + a).upper()}, None),
        lambda: (f"How many letters does the word '{word}' have? Answer with a word, not digits.",
                 {"type": "text", "value": WORDS[len(word)]}, None),
        lambda: (f"Give {a} * {b} in binary.", {"type": "text", "value": bin(a * b)[2:]}, None),
        lambda: (f"What is {a} + {b}? Answer with the result followed by '!' (for example 4!).",
                 {"type": "text", "value": f"{a + b}!"}, None),
    ]
    return rng.choice(demands)()


MAKERS: dict[str, Callable[[random.Random], Task]] = {"boxed": boxed, "units": units, "answer_first": answer_first,
                                                     "labels": labels, "hard": hard, "plain": plain, "quirk": quirk}


def kinds_for(n: int, rng: random.Random) -> list[str]:
    """`n` kinds in the SHARES proportions (largest remainders), shuffled."""
    total = sum(SHARES.values())
    exact = {k: n * s / total for k, s in SHARES.items()}
    counts = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)[: n - sum(counts.values())]:
        counts[k] += 1
    out = [k for k, c in counts.items() for _ in range(c)]
    rng.shuffle(out)
    return out


def build(per_seed: dict[str, int], seeds: int, pool: int, suite_seed: int) -> tuple[list[dict], dict[str, str]]:
    """The suite's rows (ids carry no kind) and each id's kind."""
    rng = random.Random(suite_seed)
    rows, kinds, seen = [], {}, set()
    for split, size in per_seed.items():
        for kind in kinds_for(size * seeds * pool, rng):
            for _ in range(1000):  # a new prompt if it can (labels repeat; a repeated prompt is a new task id)
                prompt, gold, choices = MAKERS[kind](rng)
                if prompt not in seen:
                    break
            seen.add(prompt)
            task_id = f"d{len(rows):04d}"
            row = {"id": task_id, "prompt": prompt, "answer": gold, "split": split}
            if choices:
                row["choices"] = choices
            rows.append(row)
            kinds[task_id] = kind
    return rows, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--per-seed", default="24,40,40", help="train,val,test tasks each seed draws")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--pool", type=int, default=2, help="pool size per split in multiples of seeds x per-seed")
    parser.add_argument("--suite-seed", type=int, default=38)
    parser.add_argument("--kinds", help="also write {task id: kind} here (analysis only)")
    args = parser.parse_args()
    sizes = dict(zip(("train", "val", "test"), (int(x) for x in args.per_seed.split(",")), strict=True))
    rows, kinds = build(sizes, args.seeds, args.pool, args.suite_seed)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    if args.kinds:
        with open(args.kinds, "w") as f:
            json.dump(kinds, f, indent=0)
    shares = {k: sum(v == k for v in kinds.values()) / len(kinds) for k in SHARES}
    print(f"wrote {len(rows)} tasks to {args.out}: " + ", ".join(f"{k} {s:.0%}" for k, s in shares.items()))


if __name__ == "__main__":
    main()
