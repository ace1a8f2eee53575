"""H2 action realization: the final answer is the text after the last `Answer:`."""

import re

from ecdysis.harness.api import Action, ActionContext, Reject, answer

ANSWER = re.compile(r"^\s*\**\s*(?:final\s+)?answer\s*\**\s*:\s*\**\s*(.+?)\s*\**\s*$", re.IGNORECASE | re.MULTILINE)


def realize(reply: str, ctx: ActionContext) -> Action | Reject:
    found = ANSWER.findall(reply)
    if found:
        return answer(found[-1].strip().rstrip("."))
    return Reject("End your reply with a line `Answer: <your answer>`.", rule="answer-format")
