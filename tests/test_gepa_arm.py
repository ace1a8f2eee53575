"""The gepa arm with scripted models, end to end through the real `gepa` package: its adapter runs our runner
(store, cache, accounting), its reflection LM is our role model, candidates are checked, the budget holds,
the best candidate is frozen and tested, the curve is stored, a rerun resumes."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import ROLES, jsonl_project

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.report.html import render_report
from ecdysis.trainer import records
from ecdysis.trainer.checks import CheckFailed
from ecdysis.trainer.gepa_adapter import apply_components, text_components
from ecdysis.trainer.gepa_arm import train_gepa
from ecdysis.trainer.records import CurvePoint
from ecdysis.workspace import Workspace

pytest.importorskip("gepa")

RULE = "Never use LaTeX boxes."
NEW_CONTRACT = f"You solve arithmetic word problems. {RULE}\nFinish with a final line of the form:\nAnswer: <number>"


def obedient_adder(messages: list[Message]) -> str:
    """Writes `Answer: n` only when the system prompt forbids boxes (else `\\boxed{n}`, which the seed rejects)."""
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    system = messages[0].content if messages[0].role == "system" else ""
    return f"Adding.\nAnswer: {a + b}" if RULE in system else f"Adding.\n\\boxed{{{a + b}}}"


class Reflector:
    """The reflection LM: records what it was shown and proposes the rule (contract) or one tip (tips)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, messages: list[Message]) -> str:
        prompt = messages[-1].content
        self.prompts.append(prompt)
        if "short tips" in prompt:
            return "```\n- Check the arithmetic twice.\n```"
        return f"Here is the new instruction:\n```\n{NEW_CONTRACT}\n```"


def gepa_ws(tmp_path: Path, reflector: Reflector, *overrides: str) -> Workspace:
    rows = [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3),
             "split": "train" if i < 6 else "val" if i < 10 else "test"} for i in range(14)]
    cfg = load_config(None, [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"',
                             f'run.run_dir="{tmp_path / "run"}"', "train.train_limit=6", "train.val_limit=4",
                             "train.test_limit=4", f'cache.path="{tmp_path / "c.sqlite"}"', *overrides])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = ScriptedModel(obedient_adder, name="adder")
    for role in (*ROLES, "reflector"):
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(reflector, name="reflector")
    return ws


async def test_gepa_runs_end_to_end_through_our_runner(tmp_path: Path) -> None:
    reflector = Reflector()
    ws = gepa_ws(tmp_path, reflector, "train.rounds=2")  # no shared budget set: rounds x (train + val) = 20
    result = await train_gepa(ws.config, ws)
    assert result.budget.agent_executions == 20 and result.agent_executions <= 20 + 6  # one iteration may overshoot
    assert result.val_before == 0.0 and result.val_after == 1.0  # the seed rejects boxes; the new rule fixes it
    assert result.test_before["accuracy"] == 0.0 and result.test_after["accuracy"] == 1.0
    final = ws.store.load_version(result.final_harness_id)
    assert RULE in final.files["contract.md"] and (result.frozen_dir / "contract.md").read_text() == \
        final.files["contract.md"]
    # the reflection LM read our trajectories: the failing reply, the expected answer and the failure facts
    first = reflector.prompts[0]
    assert "\\boxed{" in first and "Expected answer:" in first and "wrapped as boxed" in first
    assert not any(f"q{i}" in p for p in reflector.prompts for i in range(6, 14))  # val and test never shown
    store = ws.store
    roles = {r["role"]: r for r in store.call_totals(result.run_id)}
    assert roles["reflector"]["calls"] == result.optimizer_calls == len(reflector.prompts)
    labels = {e["label"] for e in store.evaluations(result.run_id)}
    assert labels == {"train", "val", "test"}
    # agent executions are the training episodes actually run (cache-served ones apart), test excluded
    episodes = [t for e in store.evaluations(result.run_id) if e["label"] != "test"
                for t in store.trajectories(e["id"])]
    assert result.agent_executions + result.cached_executions == len(episodes)
    curve = [p for _, p in records.load_all(store, result.run_id, CurvePoint)]
    assert curve == result.curve and curve[0].step == 0 and curve[0].val_score == 0.0
    assert curve[-1].harness_id == result.final_harness_id and curve[-1].val_score == 1.0
    assert any(p.accepted for p in curve) and all(p.arm == "gepa" for p in curve)
    steps = [p.agent_executions for p in curve]
    assert steps == sorted(steps) and steps[-1] <= result.agent_executions
    assert [v["note"] for v in store.versions() if v["id"] == result.final_harness_id][0].startswith("gepa ")
    assert f'id="version-{result.final_harness_id}"' in render_report(store, result.run_id)  # a report like any run


async def test_shared_budget_stops_gepa_and_a_rerun_resumes(tmp_path: Path) -> None:
    reflector = Reflector()
    ws = gepa_ws(tmp_path, reflector, "train.budget.agent_executions=10")  # the seed's val (4) and one
    # iteration (parent and child on a minibatch of 3) ...
    result = await train_gepa(ws.config, ws)
    assert result.budget.agent_executions == 10 and result.stop_reason.startswith("budget spent")
    assert result.agent_executions == 14  # ... which ends with the accepted child's val evaluation (4)
    assert [p.step for p in result.curve] == [0, 1]
    calls = len(reflector.prompts)
    again = await train_gepa(ws.config, ws)  # same config: GEPA state and evaluations are read back
    assert again.final_harness_id == result.final_harness_id
    assert again.agent_executions == result.agent_executions and len(reflector.prompts) == calls
    assert (ws.config.run.run_dir / "gepa" / result.run_id / "gepa_state.bin").exists()


def test_components_round_trip_and_are_checked(tmp_path: Path) -> None:
    ws = gepa_ws(tmp_path, Reflector())
    seed = ws.harness()
    components = text_components(seed)
    assert set(components) == {"contract", "tips"} and components["tips"] == ""
    train = ws.tasks("train", None)
    assert apply_components(seed, components, train) is seed
    version = apply_components(seed, {"contract": "Be brief.", "tips": "1. Check twice.\n\n- Show the sum."}, train)
    assert version.files["contract.md"] == "Be brief.\n"
    assert [s["tip"] for s in json.loads(version.files["skills.json"])] == ["Check twice.", "Show the sum."]
    assert text_components(version)["tips"] == "Check twice.\nShow the sum."
    with pytest.raises(CheckFailed, match="gold answer"):  # a training answer copied into the prompt
        apply_components(seed, {"contract": "The result is often 1234.", "tips": ""},
                         [replace(train[0], gold="1234")])
    with pytest.raises(CheckFailed, match="task id"):
        apply_components(seed, {"contract": f"Remember {train[0].id}.", "tips": ""}, train)
