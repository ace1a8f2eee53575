"""H2: only a final line `Answer: <answer>` is accepted."""

import re

from ecdysis.harness.api import Action, ActionContext, Reject, answer

FINAL = re.compile(r"^Answer:\s*(\S.*?)\s*$")


def realize(reply: str, ctx: ActionContext) -> Action | Reject:
    lines = [line for line in reply.strip().splitlines() if line.strip()]
    found = FINAL.match(lines[-1]) if lines else None
    if found:
        return answer(found.group(1))
    return Reject("End your reply with a final line `Answer: <answer>`.", rule="answer-format")
