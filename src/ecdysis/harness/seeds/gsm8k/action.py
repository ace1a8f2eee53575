"""H2 action realization: the final answer must be on a line `Answer: <number>`."""

import re

from ecdysis.harness.api import Action, ActionContext, Reject, answer

ANSWER_LINE = re.compile(r"^\s*Answer:\s*(-?[\d,]*\.?\d+)\s*$", re.MULTILINE)


def realize(reply: str, ctx: ActionContext) -> Action | Reject:
    found = ANSWER_LINE.findall(reply)
    if found:
        return answer(found[-1].replace(",", ""))
    return Reject("End your reply with a line `Answer: <number>`.", rule="answer-format")
