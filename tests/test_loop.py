"""The agent loop with scripted models, run in-process (the sandbox is tested separately)."""

from __future__ import annotations

from pathlib import Path

from helpers import seed_with, sync_chat

from ecdysis.agent.loop import load_realize, run_episode
from ecdysis.agent.realize import replay_item
from ecdysis.agent.trajectory import Trajectory
from ecdysis.envs import get_environment, make_episode
from ecdysis.harness.repairs import parse_repairs
from ecdysis.models import ScriptedModel


def run(version, task, replies, tmp_path: Path, env: str) -> Trajectory:  # type: ignore[no-untyped-def]
    version.write(tmp_path / "h")
    traj = Trajectory(task_id=task.id, trial=0, harness_id=version.id)
    episode = make_episode(env, task.public, {})
    run_episode(version, tmp_path / "h", task.public_view(), episode, sync_chat(ScriptedModel(replies)), traj)
    traj.final_state = episode.final_state()
    episode.close()
    return traj


def test_single_turn_rejection_then_correction(tmp_path: Path, data_dir: Path) -> None:
    env = get_environment("gsm8k", data_dir=data_dir)
    task = next(t for t in env.tasks("test") if t.gold == 18)
    version = seed_with("gsm8k", **{"harness.toml": _manifest(max_rejections=1)})
    traj = run(version, task, ["The answer is \\boxed{18}.", "Answer: 18"], tmp_path, "gsm8k")
    kinds = [e["kind"] for e in traj.events]
    assert kinds == ["prompt", "model", "rejection", "model", "action"]
    assert traj.termination == "answered" and traj.final_answer == "18"
    assert env.grade(task, traj.final_answer, traj.final_state).passed
    second_call = traj.of_kind("model")[1]["messages"]
    assert second_call[-1]["content"].startswith("End your reply with a line `Answer: <number>`")
    assert traj.model_calls == 2


def test_single_turn_rejected_too_often(tmp_path: Path, data_dir: Path) -> None:
    env = get_environment("gsm8k", data_dir=data_dir)
    task = env.tasks("test")[0]
    traj = run(seed_with("gsm8k"), task, ["\\boxed{3}"], tmp_path, "gsm8k")
    assert traj.termination == "rejected" and traj.final_answer is None
    assert traj.of_kind("rejection")[0]["rule"] == "answer-format"


def test_multi_turn_sql_episode(tmp_path: Path, data_dir: Path) -> None:
    env = get_environment("dbbench", data_dir=data_dir)
    task = next(t for t in env.tasks("train") if t.meta["type"] == "UPDATE")
    replies = [
        "I will look first.\nAction: Operation\n```sql\nSELECT COUNT(*) FROM `" + task.public["table_name"] + "`;\n```",
        "Oops, no action here.",
        "Action: Operation\n```sql\n" + task.gold[0] + "\n```",
        "Action: Answer\nFinal Answer: [\"done\"]",
    ]
    traj = run(seed_with("dbbench"), task, replies, tmp_path, "dbbench")
    assert traj.termination == "answered"
    assert [e["rule"] for e in traj.of_kind("rejection")] == ["no-action"]
    assert [e["tool"] for e in traj.of_kind("action")] == ["sql", "sql", "answer"]
    assert traj.of_kind("observation")[0]["text"].startswith("[(")
    assert env.grade(task, traj.final_answer, traj.final_state).passed


def test_error_answer_sends_the_agent_back_to_fix_its_statement(tmp_path: Path, data_dir: Path) -> None:
    """The DBBench failure the compares found: after a SQL error the agent answers with the error text. With
    `error_answer` enabled that answer is rejected with the error as feedback and the agent fixes the query;
    without it the episode ends on the error and fails."""
    env = get_environment("dbbench", data_dir=data_dir)
    task = next(t for t in env.tasks("train") if t.meta["type"] == "UPDATE")
    replies = [
        "Action: Operation\n```sql\nUPDATE `no such table` SET x = 1;\n```",
        'Action: Answer\nFinal Answer: ["Error: no such table: no such table"]',
        "Action: Operation\n```sql\n" + task.gold[0] + "\n```",
        'Action: Answer\nFinal Answer: ["done"]',
    ]
    bare = run(seed_with("dbbench"), task, replies, tmp_path / "bare", "dbbench")
    assert bare.final_answer == '["Error: no such table: no such table"]' and not bare.of_kind("rejection")
    assert not env.grade(task, bare.final_answer, bare.final_state).passed

    fixed = run(seed_with("dbbench", **{"repairs.json": '["error_answer"]'}), task, replies, tmp_path / "fixed",
                "dbbench")
    rejection = fixed.of_kind("rejection")
    assert [e["rule"] for e in rejection] == ["error-answer"]
    assert "no such table" in rejection[0]["feedback"] and "Fix the action" in rejection[0]["feedback"]
    assert [e["tool"] for e in fixed.of_kind("action")] == ["sql", "sql", "answer"]
    assert [e["name"] for e in fixed.of_kind("repair")] == ["error_answer"]
    assert fixed.final_answer == '["done"]' and env.grade(task, fixed.final_answer, fixed.final_state).passed

    # replay sees what the live loop saw: the stored episode's observations reach the candidate's H2
    candidate = seed_with("dbbench", **{"repairs.json": '["error_answer"]'})
    candidate.write(tmp_path / "candidate")
    item = {"prompt": task.prompt, "replies": bare.reply_records(), "tools": bare.offered_tools(),
            "observations": bare.observations_before_replies()}
    assert item["observations"][0] == "" and item["observations"][1].startswith("Error: no such table")
    replayed = replay_item(load_realize(candidate, tmp_path / "candidate"), parse_repairs('["error_answer"]'), item)
    assert replayed[1] == {"reject": "error-answer"} and "actions" in replayed[0]


def test_regulation_stops_a_loop(tmp_path: Path, data_dir: Path) -> None:
    env = get_environment("dbbench", data_dir=data_dir)
    task = env.tasks("train")[0]
    same = "Action: Operation\n```sql\nSELECT 1;\n```"
    traj = run(seed_with("dbbench"), task, [same], tmp_path, "dbbench")
    assert traj.termination == "stopped"
    assert traj.of_kind("annotation")[0]["text"].startswith("(You already ran this exact statement")
    assert traj.of_kind("stop")[0]["reason"] == "same statement repeated three times"


def test_skills_and_demos_reach_the_prompt(tmp_path: Path, data_dir: Path) -> None:
    env = get_environment("gsm8k", data_dir=data_dir)
    task = env.tasks("test")[0]
    version = seed_with("gsm8k", **{
        "skills.json": '[{"id": "fmt", "trigger": "*", "tip": "No LaTeX."}]',
        "demos.json": '[{"user": "1+1?", "assistant": "1+1=2\\nAnswer: 2"}]',
    })
    traj = run(version, task, ["Answer: 5"], tmp_path, "gsm8k")
    messages = traj.of_kind("model")[0]["messages"]
    assert messages[0]["role"] == "system" and "- No LaTeX." in messages[0]["content"]
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user"]
    assert traj.of_kind("prompt")[0]["skills"] == ["fmt"]


def _manifest(max_rejections: int) -> str:
    from helpers import seed_files

    text = seed_files("gsm8k")["harness.toml"]
    return text.replace("max_rejections = 0", f"max_rejections = {max_rejections}")
