"""Agent programs of their own: a tiny agent (plain `openai` client, a tool of its own) against a scripted
upstream, evaluated and trained end to end through its endpoint; its failures recorded and scored; its key
good for its own episode only; a lever graded by re-running it on stored replies, without a model call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROLES, Roles

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.trainer.api import train_async
from ecdysis.trainer.levers import measure_repairs
from ecdysis.trainer.rerun import runner_rerun
from ecdysis.workspace import Workspace

pytest.importorskip("fastapi")
AGENT = Path(__file__).parent / "agent_programs" / "tiny_agent.py"
LIMITS = {"meals": 100, "travel": 500, "software": 300}
PEOPLE = ["Ada", "Ben", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kai", "Lu", "Max", "Ned"]
AMOUNTS = [80, 120, 450, 700, 250, 350, 60, 140, 90, 520, 310, 290, 95, 105]


def expense_rows() -> list[dict]:
    """Approve-or-deny questions the agent's `policy_limit` tool decides: 6 train, 4 val, 4 test."""
    rows = []
    for i, (name, amount) in enumerate(zip(PEOPLE, AMOUNTS, strict=True)):
        category = list(LIMITS)[i % 3]
        rows.append({"id": f"x{i}", "prompt": f"{name} spent ${amount} on {category}. Approve or deny?",
                     "answer": "approve" if amount <= LIMITS[category] else "deny", "choices": ["approve", "deny"],
                     "split": "train" if i < 6 else "val" if i < 10 else "test"})
    return rows


def upstream(messages: list[Message]) -> str | dict:
    """The scripted model: call the tool first, then decide from its result, wrapped in a sentence (which an
    exact grader fails until H2 maps it onto the task's answer set)."""
    user = next(m.content for m in messages if m.role == "user")
    amount, category = re.search(r"\$(\d+) on (\w+)", user).groups()
    results = [m for m in messages if m.role == "tool"]
    if not results:
        return {"text": "", "tool_calls": [{"name": "policy_limit", "arguments": {"category": category}}]}
    limit = int(re.search(r"\$(\d+)", results[-1].content).group(1))
    return f"Decision: {'approve' if int(amount) <= limit else 'deny'} (the limit is ${limit})."


def project(tmp_path: Path, rows: list[dict], *overrides: str, command: str = f'["python", "{AGENT}"]',
            responder=upstream) -> tuple[Workspace, ScriptedModel]:
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = load_config(None, ['env.name="jsonl"', f'env.options.path="{tmp_path / "tasks.jsonl"}"',
                             'env.options.grader="exact"', f"agent.command={command}", 'agent.model="scripted:up"',
                             f'run.run_dir="{tmp_path / "run"}"', "run.progress=false",
                             f'cache.path="{tmp_path / "cache.sqlite"}"', "train.rounds=2", "run.concurrency=2",
                             *overrides])
    ws = Workspace.open(cfg)
    model = ScriptedModel(responder, name="up")
    ws.backends["agent|scripted:up"] = model
    for role in ROLES:
        ws.backends[f"{role}|scripted:up"] = ScriptedModel(Roles(), name="roles")
    return ws, model


async def evaluate(ws: Workspace, split: str, label: str = "eval", tasks: list | None = None):
    ws.store.start_run("eval", {}, run_id=f"eval-{label}")
    runner = ws.runner(f"eval-{label}")
    summary = await runner.evaluate(ws.harness(), tasks or ws.tasks(split, None), 1, split, label)
    return summary, ws.store.trajectories(summary.eval_id), runner


async def test_an_agent_program_is_evaluated_through_its_endpoint_with_the_model_layer(tmp_path: Path) -> None:
    ws, model = project(tmp_path, expense_rows())
    summary, trajectories, _ = await evaluate(ws, "train")
    assert summary.episodes == 6 and summary.terminations == {"answered": 6}
    assert summary.accuracy == 0.0  # the seed adds nothing: the agent prints the model's sentence
    assert summary.model_calls == 12 == len(model.calls) and summary.prompt_tokens > 0
    traj = trajectories[0]
    kinds = [e["kind"] for e in traj.events]
    assert kinds[:5] == ["request", "prompt", "model", "action", "reply"]
    assert {"observation", "agent"} <= set(kinds)
    assert traj.final_answer.startswith("Decision: ") and traj.isolation.startswith("external program")
    assert traj.offered_tools()[0]["name"] == "policy_limit"
    first, second = traj.of_kind("model")
    assert first["messages"][1]["content"] == traj.of_kind("prompt")[0]["task"]
    assert second["messages"][-1]["role"] == "tool" and "limit for" in second["messages"][-1]["content"]
    assert traj.of_kind("agent")[0]["exit_code"] == 0
    assert all(r["overhead_ms"] >= 0 and r["status"] == 200 for r in traj.of_kind("reply"))
    totals = {row["role"]: row for row in ws.store.call_totals("eval-eval")}
    assert totals["agent"]["calls"] == 12  # recorded like the library's own loop's calls
    again, _, _ = await evaluate(ws, "train", "again")  # the same requests: served by the response cache
    assert again.cache_hits == 12 and len(model.calls) == 12
    ws.close()


async def test_an_agent_program_is_trained_end_to_end_and_beats_its_seed_on_test(tmp_path: Path) -> None:
    ws, model = project(tmp_path, expense_rows(), "train.rounds=1", "train.test_limit=2")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    final = ws.store.load_version(result.final_harness_id)
    assert "answer_set" in final.files["repairs.json"]
    measured = ws.store.get_record(result.run_id, "measurements", "r1")
    answer_set = next(m for m in measured if m["repairs"] == ["answer_set"])
    assert len(answer_set["gained"]) == 6 and answer_set["exact"] == 6 and not answer_set["lost"]
    assert result.rounds[0].accepted and result.val_before == 0.0 and result.val_after == 1.0
    assert result.test_before["accuracy"] == 0.0 and result.test_after["accuracy"] == 1.0
    test = next(e for e in ws.store.evaluations(result.run_id) if e["label"] == "test"
                and e["harness_id"] == final.id)
    assert {t.final_answer for t in ws.store.trajectories(test["id"])} <= {"approve", "deny"}
    assert (Path(result.frozen_dir) / "repairs.json").exists()
    ws.close()


async def test_a_rerun_on_stored_replies_grades_a_lever_without_a_model_call(tmp_path: Path) -> None:
    ws, model = project(tmp_path, expense_rows())
    _, trajectories, runner = await evaluate(ws, "train")
    calls = len(model.calls)
    tasks = {t.id: t for t in ws.tasks("train", None)}
    measured = await measure_repairs(ws.harness(), trajectories, ws.env, tasks, runner.limits,
                                     rerun=runner_rerun(runner))
    answer_set = next(m for m in measured if m.repairs == ["answer_set"])
    assert sorted(answer_set.gained) == sorted(tasks) and answer_set.exact == 6 and not answer_set.lost
    assert len(model.calls) == calls  # every request of the re-runs was one the stored episodes had asked
    ws.close()


async def test_crash_timeout_and_non_zero_exit_are_recorded_scored_episodes(tmp_path: Path) -> None:
    rows = [{"id": kind, "prompt": f"{kind}: Ada spent $10 on meals.", "answer": "approve", "split": "train"}
            for kind in ("CRASH", "HANG", "EXIT3")]
    ws, _ = project(tmp_path, rows, "sandbox.timeout_s=10")
    summary, trajectories, _ = await evaluate(ws, "train")
    assert summary.episodes == 3 and summary.infra_failures == 0 and summary.accuracy == 0.0
    by = {t.task_id: t for t in trajectories}
    assert by["CRASH"].termination == "crash" and "the agent fell over" in by["CRASH"].traceback
    assert by["HANG"].termination == "timeout" and by["HANG"].wall_s < 60
    assert by["EXIT3"].termination == "crash" and "status 3" in by["EXIT3"].traceback
    assert "giving up" in by["EXIT3"].of_kind("agent")[0]["stderr_tail"]
    ws.close()


async def test_an_episode_key_works_only_for_its_own_running_episode(tmp_path: Path) -> None:
    rows = [{"id": f"s{i}", "prompt": f"STEAL {i}", "answer": "denied", "split": "train"} for i in range(2)]
    ws, model = project(tmp_path, rows, "run.concurrency=1", f'agent.env.KEY_FILE="{tmp_path / "key"}"')
    summary, trajectories, _ = await evaluate(ws, "train")
    assert sorted(t.final_answer for t in trajectories) == ["denied", "first"]
    assert summary.accuracy == 0.5 and not model.calls  # the refused request never reached the model
    ws.close()


async def test_the_agent_sees_its_own_public_task_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECDYSIS_DATA_DIR", str(tmp_path / "gold"))
    monkeypatch.setenv("SOME_API_KEY", "sk-do-not-leak-0123456789")
    rows = [{"id": "leak", "prompt": "LEAK please", "answer": "GOLD-ANSWER-7", "split": "train"},
            {"id": "other", "prompt": "OTHER-TASK-TEXT", "answer": "x", "split": "val"}]
    ws, _ = project(tmp_path, rows)
    _, trajectories, _ = await evaluate(ws, "train")
    seen = trajectories[0].final_state
    assert seen["task"] == {"id": "leak", "prompt": "LEAK please", "public": {}, "conversational": False}
    text = json.dumps(seen)
    assert "GOLD-ANSWER-7" not in text and "OTHER-TASK-TEXT" not in text and "sk-do-not-leak" not in text
    assert "ECDYSIS_DATA_DIR" not in seen["env"] and seen["env"]["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
    assert json.loads(seen["env"]["ECDYSIS_TASK"]) == seen["task"]
    ws.close()


async def test_a_python_callable_is_an_agent_too(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(
        "import openai\n\n"
        "def solve(task):\n"
        "    reply = openai.OpenAI().chat.completions.create(model='m', messages=[\n"
        "        {'role': 'user', 'content': task['prompt']}]).choices[0].message.content\n"
        "    return {'answer': reply.split()[1], 'state': {'said': reply}}\n")
    rows = [{"id": "c0", "prompt": "Cy spent $90 on meals. Approve or deny?", "answer": "approve",
             "split": "train"}]
    ws, _ = project(tmp_path, rows, 'agent.callable="my_agent:solve"', f'agent.cwd="{tmp_path}"', command="[]",
                    responder=lambda messages: "Decision: approve")
    summary, trajectories, _ = await evaluate(ws, "train")
    assert summary.accuracy == 1.0 and trajectories[0].final_state == {"said": "Decision: approve"}
    assert trajectories[0].of_kind("agent")[0]["answer_source"] == "file"
    ws.close()


def test_init_writes_an_agent_project_and_eval_runs_it_from_the_command_line(tmp_path: Path) -> None:
    rows = [r for r in expense_rows() if r["split"] == "val"]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "agent.py").write_text(AGENT.read_text())
    replies = [{"text": "", "tool_calls": [{"name": "policy_limit", "arguments": {"category": "meals"}}]},
               "Decision: deny"]
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cli = [sys.executable, "-m", "ecdysis"]
    init = subprocess.run([*cli, "init", str(tmp_path), "--env", "jsonl", "--tasks", "tasks.jsonl", "--grader",
                           "exact", "--agent", "python agent.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    config = (tmp_path / "ecdysis.toml").read_text()
    assert 'command = ["python", "agent.py"]' in config and config.count("command =") == 1  # no leftover hint
    assert (tmp_path / "harness" / "contract.md").read_text() == ""
    done = subprocess.run([*cli, "eval", "-c", str(tmp_path / "ecdysis.toml"), "--model",
                           f"scripted:@{tmp_path / 'replies.json'}", "--json", "--limit", "4"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["episodes"] == 4 and out["terminations"] == {"answered": 4} and out["model_calls"] == 8
    bad = subprocess.run([*cli, "eval", "-c", str(tmp_path / "ecdysis.toml"), "--set",
                          'agent.command="no-such-program x"'], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "no-such-program" in bad.stderr


async def test_a_repeated_call_reaches_the_agent_with_a_fresh_id(tmp_path: Path) -> None:
    """A model repeating a call repeats its id (the embedded backend derives ids from the call); frameworks skip
    a call id they have run already (the Agents SDK does, and loops), so every call the agent gets has its own."""
    def repeat(messages: list[Message]) -> str | dict:
        if sum(m.role == "tool" for m in messages) < 2:
            return {"text": "", "tool_calls": [{"name": "policy_limit", "arguments": {"category": "meals"}}]}
        return "approve"

    rows = [{"id": "r0", "prompt": "Ada spent $10 on meals. Approve or deny?", "answer": "approve", "split": "train"}]
    ws, _ = project(tmp_path, rows, responder=repeat)
    summary, trajectories, _ = await evaluate(ws, "train")
    upstream_ids = {c["id"] for e in trajectories[0].of_kind("model") for c in e["tool_calls"]}
    sent_ids = [c["id"] for e in trajectories[0].of_kind("reply") for c in e["message"].get("tool_calls", [])]
    assert len(upstream_ids) == 1 and len(sent_ids) == 2 and len(set(sent_ids)) == 2 and summary.accuracy == 1.0
    ws.close()
