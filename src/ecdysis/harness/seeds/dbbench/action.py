"""H2 action realization: parse 'Action: Operation' + a SQL block, or 'Action: Answer'."""

import re

from ecdysis.harness.api import Action, ActionContext, Reject, answer

SQL_BLOCK = re.compile(r"```(?:sql)?\s*(.+?)```", re.DOTALL | re.IGNORECASE)
FINAL = re.compile(r"Final Answer:\s*(.+)", re.DOTALL)


def realize(reply: str, ctx: ActionContext) -> Action | Reject:
    if "Action: Answer" in reply:
        found = FINAL.search(reply)
        if found:
            return answer(found.group(1).strip())
        return Reject("After 'Action: Answer' write 'Final Answer: [...]'.", rule="answer-format")
    if "Action: Operation" in reply:
        block = SQL_BLOCK.search(reply)
        if block and block.group(1).strip():
            return Action("sql", block.group(1).strip())
        return Reject("Put the SQL statement in a ```sql ... ``` block.", rule="sql-block")
    return Reject("End your reply with 'Action: Operation' and a ```sql``` block, "
                  "or 'Action: Answer' and 'Final Answer: [...]'.", rule="no-action")
