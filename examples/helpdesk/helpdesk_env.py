"""An Ecdysis environment plugin, written the way a user writes theirs: a subscription helpdesk.

The agent handles one support ticket with five JSON-schema tools over a small customer database
and ends with a one-sentence reply. Graded in the host: the final database must equal the one the
gold actions produce, and question tickets must name the right value in the reply.

    ecdysis init myproj --env helpdesk_env:environment      (run from this folder, or set env.plugin_path)
    ecdysis eval -c myproj/ecdysis.toml --split test

Host side: `environment(...)` returns an object with `tasks(split)` and `grade(...)`.
Sandbox side: `make_episode(public, options)` builds the live database for one task.

The gold stays on the host: `tasks.jsonl` (requests, gold actions and answers of every split), `db.json`
and `policy.md` sit next to this module, but the sandbox sees only this module's code (and the modules of
this folder it imports). Episodes get what they need through each task's `public` view (the initial
database), so `sandbox_files` is empty; a plugin whose episodes must read a file lists it there.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecdysis.envs.base import Score, Task, check_split, read_jsonl, require
from ecdysis.harness.api import Action, ToolSpec

HERE = Path(__file__).resolve().parent
CUSTOMER_ID = {"type": "string", "pattern": "^C-[0-9]{3}$", "description": "Customer id, e.g. C-101"}
TOOLS = (
    ToolSpec("find_customer", "Look up a customer by email; returns the customer id and record.",
             {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"],
              "additionalProperties": False}),
    ToolSpec("get_customer", "Read one customer's record (name, email, plan, balance).",
             {"type": "object", "properties": {"customer_id": CUSTOMER_ID}, "required": ["customer_id"],
              "additionalProperties": False}),
    ToolSpec("change_plan", "Move a customer to another plan.",
             {"type": "object", "properties": {"customer_id": CUSTOMER_ID,
                                               "plan": {"type": "string", "enum": ["basic", "pro", "team"]}},
              "required": ["customer_id", "plan"], "additionalProperties": False}),
    ToolSpec("issue_refund", "Refund an amount in dollars (at most the balance) with a short reason.",
             {"type": "object", "properties": {"customer_id": CUSTOMER_ID, "amount": {"type": "number"},
                                               "reason": {"type": "string", "minLength": 3}},
              "required": ["customer_id", "amount", "reason"], "additionalProperties": False}),
    ToolSpec("update_email", "Change a customer's email address.",
             {"type": "object", "properties": {"customer_id": CUSTOMER_ID, "email": {"type": "string"}},
              "required": ["customer_id", "email"], "additionalProperties": False}),
)


class HelpdeskDB:
    """The live database and the tools' behaviour (used by episodes and by the grader alike)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = copy.deepcopy(data)

    def run(self, tool: str, args: dict[str, Any]) -> str:
        customers = self.data["customers"]
        if tool == "find_customer":
            for cid, c in customers.items():
                if c["email"].lower() == str(args["email"]).lower():
                    return json.dumps({"customer_id": cid, **c})
            return f"Error: no customer with email {args['email']!r}"
        cid = args.get("customer_id")
        if cid not in customers:
            return f"Error: no customer {cid!r}"
        c = customers[cid]
        if tool == "get_customer":
            return json.dumps({"customer_id": cid, **c})
        if tool == "change_plan":
            c["plan"] = args["plan"]
            return f"OK: {cid} is now on the {args['plan']} plan"
        if tool == "issue_refund":
            if args["amount"] <= 0 or args["amount"] > c["balance"]:
                return f"Error: a refund must be between 0 and the balance ({c['balance']})"
            c["balance"] -= args["amount"]
            c["notes"].append(f"refund {args['amount']:g}: {args['reason']}")
            return f"OK: refunded {args['amount']:g} to {cid}; balance now {c['balance']:g}"
        if tool == "update_email":
            c["email"] = args["email"]
            return f"OK: {cid} email is now {args['email']}"
        return f"Error: unknown tool {tool!r}"

    def state(self) -> dict[str, Any]:
        """Comparable state: plans, balances and emails (refund notes are compared without the reason)."""
        return {cid: {"plan": c["plan"], "balance": c["balance"], "email": c["email"],
                      "refunds": [n.split(":")[0] for n in c["notes"]]}
                for cid, c in sorted(self.data["customers"].items())}


class HelpdeskEpisode:
    tools = TOOLS

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = HelpdeskDB(db)

    def step(self, action: Action) -> str:
        return self.db.run(action.tool, action.arguments or {})

    def final_state(self) -> dict[str, Any]:
        return {"db": self.db.state()}

    def close(self) -> None:
        return None


@dataclass
class Helpdesk:
    """Host side: tasks from `tasks.jsonl` (each with its split), grading by final database state."""

    tasks_file: Path = HERE / "tasks.jsonl"
    db_file: Path = HERE / "db.json"
    name: str = "helpdesk_env:environment"
    tools: tuple[ToolSpec, ...] = TOOLS
    tool_names: tuple[str, ...] = tuple(t.name for t in TOOLS)
    tool_calling: str = "native"
    instructions: str = field(default_factory=lambda: (HERE / "policy.md").read_text())
    sandbox_files: tuple[str, ...] = ()  # episodes read no file: the database comes in `public`

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        db = json.loads(Path(self.db_file).read_text())
        out = []
        for lineno, obj in read_jsonl(Path(self.tasks_file)):
            if obj.get("split", "train") != split:
                continue
            gold = {"actions": require(obj, "actions", list, Path(self.tasks_file), lineno),
                    "answer": obj.get("answer")}
            out.append(Task(id=require(obj, "id", str, Path(self.tasks_file), lineno), split=split,
                            prompt=require(obj, "request", str, Path(self.tasks_file), lineno),
                            gold=gold, public={"db": db}))
        return out

    def grade(self, task: Task, answer: str | None, final_state: dict[str, Any]) -> Score:
        expected = HelpdeskDB(task.public["db"])
        for act in task.gold["actions"]:
            expected.run(act["tool"], act["arguments"])
        db_ok = final_state.get("db") == expected.state()
        want = task.gold.get("answer")
        answer_ok = want is None or (answer is not None and str(want).lower() in answer.lower())
        ok = db_ok and answer_ok and answer is not None
        detail = ("database matches" if db_ok else "database differs from the expected one") + (
            "" if want is None else f"; answer {'names' if answer_ok else 'lacks'} {want!r}")
        return Score(float(ok), ok, detail, {"db_match": db_ok, "answer_ok": answer_ok})


def environment(data_dir: Path | None = None, seed: int = 0, **options: Any) -> Helpdesk:
    """The plugin's factory (`env.name = "helpdesk_env:environment"`)."""
    return Helpdesk(**{k: Path(v) for k, v in options.items() if k in ("tasks_file", "db_file")})


def make_episode(public: dict[str, Any], options: dict[str, Any]) -> HelpdeskEpisode:
    return HelpdeskEpisode(public["db"])
