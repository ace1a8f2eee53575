"""A 12-label classification suite from public data (issue 24): which writing system a short text is in.

    python benchmarks/scripts_suite/make_suite.py OUT.jsonl [--per-label 8]

The data is the Unicode Character Database that ships with Python (`unicodedata`; Unicode licence): for each
of 12 scripts, "words" of 3-5 letters drawn (seeded) from that script's letters. Per label: 3 train, 2 val,
the rest test (default 8: 36 train / 24 val / 36 test). Each line declares the 12 labels as its `choices`
and its label as its `kind`, so `--limit` can stratify and the `answer_set` repair can act. Grade with the
built-in `normalized` grader.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import unicodedata
from pathlib import Path

SCRIPTS = {  # label -> the first word of the Unicode character names of its letters
    "Greek": "GREEK", "Cyrillic": "CYRILLIC", "Armenian": "ARMENIAN", "Hebrew": "HEBREW", "Arabic": "ARABIC",
    "Devanagari": "DEVANAGARI", "Bengali": "BENGALI", "Tamil": "TAMIL", "Thai": "THAI", "Georgian": "GEORGIAN",
    "Hiragana": "HIRAGANA", "Katakana": "KATAKANA",
}
LABELS = list(SCRIPTS)


def letters(prefix: str) -> list[str]:
    """Letters of one script: names "<SCRIPT> [SMALL] LETTER ..." or "<SCRIPT> CHARACTER ..." (no marks, digits)."""
    out = []
    for code in range(0x0370, 0x3100):
        ch = chr(code)
        name = unicodedata.name(ch, "")
        if name.startswith((prefix + " LETTER ", prefix + " SMALL LETTER ", prefix + " CHARACTER ")) and \
                unicodedata.category(ch) in ("Lo", "Ll"):
            out.append(ch)
    return out


def rows(per_label: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for label, prefix in SCRIPTS.items():
        pool = letters(prefix)
        for i in range(per_label):
            word = "".join(rng.choice(pool) for _ in range(rng.randint(3, 5)))
            split = "train" if i < 3 else "val" if i < 5 else "test"
            out.append({"id": f"script-{label.lower()}-{i}", "split": split, "kind": label, "answer": label,
                        "prompt": f"Which writing system is this text written in: {word}\n"
                                  f"Choose one of: {', '.join(LABELS)}.",
                        "choices": LABELS})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-label", type=int, default=8)
    args = parser.parse_args()
    data = rows(args.per_label)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
    print(f"{len(data)} tasks, {len(LABELS)} labels -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
