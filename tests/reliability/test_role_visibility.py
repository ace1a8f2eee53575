"""What the optimizer roles see (the README's rule): training failures with their evidence; of val, only
aggregate scores (an earlier round's decision, e.g. "val 0.000 -> 1.000"); never a val or test task's text,
id or reply. Checked on every prompt every role receives during a real (scripted) training run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import ROLES, Roles, jsonl_project  # noqa: E402

from ecdysis.config import load_config  # noqa: E402
from ecdysis.models import Message, ScriptedModel  # noqa: E402
from ecdysis.trainer import train_async  # noqa: E402
from ecdysis.workspace import Workspace  # noqa: E402

TRICKY = "carefully"  # training tasks the agent gets wrong however its answer is parsed: round 2 has failures


class Listening(Roles):
    """Scripted roles that keep every prompt they were sent."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []

    def __call__(self, messages: list[Message]) -> str:
        self.prompts.append("\n".join(m.content for m in messages))
        return super().__call__(messages)


def agent(messages: list[Message]) -> str:
    """Adds the first two numbers, boxed (the seed harness cannot parse that); wrong on the tricky tasks."""
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    return f"The result is \\boxed{{{a + b + (1 if TRICKY in messages[-1].content else 0)}}}"


async def test_roles_see_aggregate_val_scores_and_no_val_or_test_task(tmp_path: Path) -> None:
    rows = ([{"id": f"tr{i}", "prompt": f"Add {i} and {i + 3}{' ' + TRICKY if i < 3 else ''}.",
              "answer": str(2 * i + 3), "split": "train"} for i in range(8)]
            + [{"id": f"heldout{i}", "prompt": f"Add {i} and {i + 5}. Ticket VALQUESTION{i}.",
                "answer": str(2 * i + 5), "split": "val"} for i in range(5)]
            + [{"id": f"final{i}", "prompt": f"Add {i} and {i + 7}. Ticket TESTQUESTION{i}.",
                "answer": str(2 * i + 7), "split": "test"} for i in range(3)])
    config = load_config(None, [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"',
                                f'run.run_dir="{tmp_path / "run"}"', "train.rounds=2", 'train.accept_on="val"',
                                'train.acceptance="strict"',  # the aggregate's wording below is the strict rule's
                                f'cache.path="{tmp_path / "c.sqlite"}"'])
    ws = Workspace.open(config)
    ws.backends["agent|scripted:agent"] = ScriptedModel(agent, name="adder")
    roles = Listening()
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(roles, name="roles")
    await train_async(ws.config, "ecdysis", ws=ws)
    ws.close()

    assert roles.prompts and any("expected '5' -> answered '6'" in p for p in roles.prompts)  # train evidence
    for prompt in roles.prompts:
        for row in rows:
            if row["split"] != "train":
                assert row["id"] not in prompt and row["prompt"] not in prompt, (row["id"], prompt[-600:])
        assert "VALQUESTION" not in prompt and "TESTQUESTION" not in prompt
    later = [p for p in roles.prompts if "round 1:" in p]
    assert later and all(re.search(r"val \d\.\d{3} -> \d\.\d{3}", p) for p in later)  # the aggregate, by design
