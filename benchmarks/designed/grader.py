"""The designed suite's grader (make_suite.py): strict on purpose, so each harness-level failure kind fails.

- numbers: the answer is the plain number (digits, an optional minus sign and decimal part; one trailing
  period allowed), equal to the gold: `30000` passes, `30,000`, `$30000` and `30000 bottles` do not;
- labels: the answer is the label exactly as declared (`positive`; not `Positive`, `positive.`);
- text (the quirks): equal ignoring case, surrounding spaces and one trailing period.
"""

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def grade(answer, gold):
    if answer is None:
        return False
    text = answer.strip()
    if gold["type"] == "number":
        text = text.removesuffix(".")
        return bool(NUMBER.fullmatch(text)) and float(text) == float(gold["value"])
    if gold["type"] == "label":
        return text == gold["value"]
    return text.removesuffix(".").strip().lower() == str(gold["value"]).lower()
