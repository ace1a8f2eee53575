"""The short-answer suite's grader: numbers numerically, letters and words by their first token."""

import re


def grade(answer, gold):
    if answer is None:
        return False
    text = answer.strip().strip("*").strip()
    if re.fullmatch(r"-?\d+", gold):
        found = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
        return bool(found) and float(found[0]) == float(gold)
    first = re.findall(r"[A-Za-z]+", text)
    return bool(first) and first[0].lower() == gold.lower()
