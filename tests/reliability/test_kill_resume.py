"""SIGKILL at several phases of a real `ecdysis train` process (and of `compare`), restarted with the same
command each time: the run ends with the same decisions, records and final harness as an uninterrupted
one, with no lost or duplicated trajectories (scripted models, real sandbox, real store)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import BOXED_SPEC  # noqa: E402

# even tasks expect 3 (the scripted agent's boxed answer), odd ones 4: the boxed repair fixes half of them
TASKS = [{"id": f"t{i}", "prompt": f"Task {i}: what is 1 plus 2?", "answer": "3" if i % 2 == 0 else "4",
          "split": "train" if i < 6 else ("val" if i < 10 else "test")} for i in range(14)]
PHASES = {  # phase -> SQL that becomes true once the run has reached it
    "collect": "SELECT COUNT(*) >= 2 FROM trajectories",
    "diagnosis and debate": "SELECT COUNT(*) >= 1 FROM records WHERE kind IN ('patterns', 'transcript')",
    "validation": "SELECT COUNT(*) >= 1 FROM records WHERE kind = 'candidate'",
    "round 2": "SELECT COUNT(*) >= 1 FROM records WHERE kind = 'decision'",
    "test": "SELECT COUNT(*) >= 1 FROM evaluations WHERE split = 'test'",
}


def command(project: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "ecdysis", "train", "-c", str(project / "ecdysis.toml"), "--run-dir", str(run_dir),
            "--rounds", "2", "--set", "train.test_limit=4", "--model", "scripted:Adding. The sum is \\boxed{3}",
            "--roles-model", f"scripted:{json.dumps(BOXED_SPEC)}"]


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECDYSIS_")}
    return {**env, "HOME": str(home)}  # each run family has its own response cache


def reached(db: Path, sql: str) -> bool:
    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return bool(con.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:  # tables not created yet
        return False


def run_and_kill(args: list[str], env: dict[str, str], cwd: Path, db: Path, sql: str) -> bool:
    """Start the command; SIGKILL it as soon as `sql` holds. Returns False if it finished first."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        if reached(db, sql):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.01)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    return False


# time so far (real and charged: scripted models are charged their latency); a call in flight is paid again
CURVE_VOLATILE = ("wall_s", "charged_s", "optimizer_calls", "optimizer_tokens")


def steady(value: Any) -> Any:
    """`value` without what a kill may change: the time so far, the optimizer accounting (a call in flight is
    paid again), and which executions were served from the cache (an episode whose calls were cached before the
    kill is served from it on resume): their total stays."""
    if isinstance(value, list):
        return [steady(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: steady(v) for k, v in value.items() if k not in CURVE_VOLATILE}
    if "agent_executions" in out and "cached_executions" in out:
        out["executions"] = out.pop("agent_executions") + out.pop("cached_executions")
    return out


def untimed(data: str) -> str:
    return json.dumps(steady(json.loads(data)), sort_keys=True)


def snapshot(db: Path) -> dict[str, Any]:
    """What a finished run decided and recorded, with run and evaluation ids (which hash the run directory)
    replaced by what they stand for; timings excluded."""
    with sqlite3.connect(db) as con:
        evals = {eid: f"{label}/{split}/{harness}" for eid, label, split, harness in
                 con.execute("SELECT id, label, split, harness_id FROM evaluations")}
        runs = {rid: kind for rid, kind in con.execute("SELECT id, kind FROM runs")}
        trajectories = sorted((evals[e], task, trial, score, termination) for e, task, trial, score, termination in
                              con.execute("SELECT eval_id, task_id, trial, score, termination FROM trajectories"))
        records = sorted((runs.get(rid, rid), kind, key, untimed(data)) for rid, kind, key, data in
                         con.execute("SELECT run_id, kind, key, data FROM records WHERE kind != 'timing'"))
        versions = con.execute("SELECT id, parent FROM harness_versions ORDER BY id").fetchall()
        finals = sorted((kind, status, json.loads(summary or "{}").get("final_harness_id"))
                        for kind, status, summary in con.execute("SELECT kind, status, summary FROM runs"))
    return {"trajectories": trajectories, "records": records, "versions": versions, "runs": finals}


def project(tmp_path: Path) -> Path:
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    out = subprocess.run([sys.executable, "-m", "ecdysis", "init", "proj", "--env", "jsonl", "--tasks", "tasks.jsonl"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return tmp_path / "proj"


def kill_and_resume(tmp_path: Path, make: Callable[[Path, Path], list[str]],
                    phases: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], list[str], Path, Path]:
    """An uninterrupted run, and a run SIGKILLed once per phase not yet reached and then finished with the
    same command (each with its own response cache). Returns (reference, resumed, kills, their run dirs)."""
    proj = project(tmp_path)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    done = subprocess.run(make(proj, reference_dir), cwd=tmp_path, env=environment(tmp_path / "home-a"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    env, db = environment(tmp_path / "home-b"), killed_dir / "ecdysis.sqlite"
    kills = [phase for phase, sql in phases.items()  # a phase an earlier kill already passed is skipped
             if not reached(db, sql) and run_and_kill(make(proj, killed_dir), env, tmp_path, db, sql)]
    final = subprocess.run(make(proj, killed_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stdout + final.stderr
    return snapshot(reference_dir / "ecdysis.sqlite"), snapshot(db), kills, reference_dir, killed_dir


def test_train_killed_at_every_phase_resumes_to_the_same_result(tmp_path: Path) -> None:
    reference, resumed, kills, _, _ = kill_and_resume(tmp_path, command, PHASES)
    assert len(kills) >= 3, kills  # killed in at least three distinct phases
    assert resumed["runs"] == reference["runs"] and reference["runs"][0][1] == "finished"
    assert resumed["versions"] == reference["versions"]
    assert resumed["records"] == reference["records"]  # decisions, specs, transcripts, patterns, candidates
    assert resumed["trajectories"] == reference["trajectories"]  # none lost, none duplicated
    decision = json.loads(next(d for _, k, key, d in resumed["records"] if k == "decision" and key == "r1"))
    assert decision["accepted"], decision  # the run did something worth resuming: round 1 accepted the repair


COMPARE_PHASES = {
    "fixed arm": "SELECT COUNT(*) >= 1 FROM trajectories",
    "serial arm": "SELECT COUNT(*) >= 1 FROM records WHERE kind = 'serial-edit'",
    "ecdysis debate": "SELECT COUNT(*) >= 1 FROM records WHERE kind = 'transcript' AND run_id LIKE 'train-ecdysis%'",
    "ecdysis test": "SELECT COUNT(*) >= 1 FROM runs WHERE id LIKE 'train-ecdysis%' AND status = 'finished'",
}


def compare_command(project: Path, run_dir: Path) -> list[str]:
    roles = f"scripted:{json.dumps(BOXED_SPEC)}"
    return [sys.executable, "-m", "ecdysis", "compare", str(project / "ecdysis.toml"), "--arms", "fixed,serial,ecdysis",
            "--set", f'run.run_dir="{run_dir}"', "--set", "train.rounds=1", "--set", "train.test_limit=4",
            "--set", "train.serial_max_edits=2", "--set", 'agent.model="scripted:Adding. The sum is \\\\boxed{3}"',
            *[arg for role in ("analyst", "critic", "engineer", "moderator", "implementer")
              for arg in ("--set", f"roles.{role}={json.dumps(roles)}")]]


def test_compare_killed_in_several_arms_resumes_to_the_same_table(tmp_path: Path) -> None:
    reference, resumed, kills, reference_dir, killed_dir = kill_and_resume(tmp_path, compare_command, COMPARE_PHASES)
    assert len(kills) >= 2, kills
    assert resumed["trajectories"] == reference["trajectories"] and resumed["versions"] == reference["versions"]
    assert [r for r in resumed["records"] if r[1] != "arm"] == [r for r in reference["records"] if r[1] != "arm"]
    # wall times differ, and so may the accounting: a call in flight at the kill is paid (and counted) again
    volatile = ("train_wall_s", "speedup_vs_serial", "optimizer_calls", "optimizer_tokens", "agent_tokens",
                "charged_parts")  # scripted models are charged their latency: 0.000 or 0.001 s under load
    def kept(key: str) -> bool:  # times (`*_s`) and ratios of times (`speedup_*`) differ run to run
        return key not in volatile and not key.endswith("_s") and not key.startswith("speedup")

    def sandbox_parts(path: Path) -> list[tuple[str, float | None]]:  # the charged part that is not a latency
        return [(row["arm"], (row.get("charged_parts") or {}).get("sandbox"))
                for row in json.loads(path.read_text())]

    assert sandbox_parts(killed_dir / "compare.json") == sandbox_parts(reference_dir / "compare.json")

    table = [steady({k: v for k, v in row.items() if kept(k)})
             for row in json.loads((killed_dir / "compare.json").read_text())]
    expected = [steady({k: v for k, v in row.items() if kept(k)})
                for row in json.loads((reference_dir / "compare.json").read_text())]
    assert table == expected  # same arms, accuracies, edits, executions and harnesses
