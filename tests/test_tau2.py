"""τ²-bench through the real `tau2` package: episodes driven by our loop, graded by τ²'s evaluator."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.workspace import Workspace

CALL = '<tool_call>{"name": "create_task", "arguments": {"user_id": "user_1", "title": "%s"}}</tool_call>'


def agent(title: str) -> ScriptedModel:
    """Asks nothing, creates the task with `title` once the user has spoken, then confirms."""

    def respond(messages: list[Message]) -> str:
        if messages[-1].role == "tool":
            return "Your task has been created."
        if any(m.role == "tool" for m in messages):
            return "Anything else?"
        return CALL % title

    return ScriptedModel(respond, name=f"tau2-agent-{title}")


def user(messages: list[Message]) -> str:
    """The simulated user (roles flipped: the agent speaks as `user`)."""
    assert "Important Meeting" in messages[0].content  # the scenario reaches the user, in the host
    if len(messages) <= 2:
        return "Hi, please create a task called 'Important Meeting' for user_1."
    return "Thanks! ###STOP###"


def run(tmp_path: Path, title: str) -> tuple[float, list]:
    cfg = load_config(None, ['env.name="tau2-mock"', 'agent.model="scripted:agent"', 'user.model="scripted:user"',
                             f'run.run_dir="{tmp_path / title}"', "run.progress=false",
                             f'cache.path="{tmp_path / "c.sqlite"}"'])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = agent(title)
    ws.backends["user|scripted:user"] = ScriptedModel(user, name="tau2-user")
    tasks = [t for t in ws.env.tasks("val") if t.id == "tau2-mock-create_task_1"]
    assert tasks and tasks[0].user_scenario and "user_scenario" not in tasks[0].public_view()
    summary = asyncio.run(ws.runner("r").evaluate(ws.harness(), tasks, 1, "val", "eval"))
    trajectories = ws.store.trajectories(summary.eval_id)
    calls = {row["role"]: row["calls"] for row in ws.store.call_totals("r")}
    assert calls["user"] == 2 and calls["agent"] == 2  # the user's calls are accounted under their own role
    return summary.accuracy, trajectories


def test_tau2_mock_known_solution_scores_one_and_a_wrong_one_zero(tmp_path: Path) -> None:
    right, trajectories = run(tmp_path, "Important Meeting")
    t = trajectories[0]
    assert right == 1.0, t.score_detail
    assert t.termination == "user_stop" and "tau2 reward 1" in t.score_detail
    assert [m["role"] for m in t.conversation][:3] == ["assistant", "user", "assistant"]
    assert t.final_state["tool_log"][0]["name"] == "create_task"
    wrong, trajectories = run(tmp_path, "Meeting")
    assert wrong == 0.0 and "tau2 reward 0" in trajectories[0].score_detail
