"""`compare` with scripted models: every arm runs; serial edits once per failure, ecdysis once per round;
caps hold; ratios come from the recorded numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import Roles, add_answer, make_ws

from ecdysis.models import Message, ScriptedModel
from ecdysis.store import RunStore
from ecdysis.trainer.compare import ARMS, compare, write_results

USELESS_SPEC = {"patterns_addressed": ["P1"], "changes": [{"layer": "H3", "kind": "add_rule", "file": "",
                "text": "Be careful with arithmetic.", "repair": "", "value": 0,
                "rationale": "P1 needs care, not a new repair"}],
                "skills": [], "implementation_notes": "", "expected_effect": "none really"}


async def test_every_arm_runs_with_caps_and_ratios(tmp_path: Path) -> None:
    roles = Roles(spec=USELESS_SPEC)
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), "train.rounds=2", "train.serial_max_edits=4")
    results = await compare(ws.config, list(ARMS), seeds=1, open_workspace=lambda cfg: ws)
    by_arm = {r.arm: r for r in results}
    assert set(by_arm) == set(ARMS)
    assert by_arm["direct"].test_acc == 0.0  # the bare harness answers the raw reply; exact match wants "8"
    assert by_arm["fixed"].test_acc == 0.0 and by_arm["fixed"].train_acc == 0.0
    store = RunStore(ws.config.run.run_dir)  # compare closed the workspace
    serial_run = next(r["id"] for r in store.runs() if r["id"].startswith("train-serial"))
    ecdysis_run = next(r["id"] for r in store.runs() if r["id"].startswith("train-ecdysis"))
    assert store.count_records(serial_run, "serial-edit") == 4  # capped: one attempt per failure, 6 failures
    assert len(store.records(ecdysis_run, "spec")) == 2  # one spec per round, two rounds
    assert by_arm["serial"].accepted_edits == 0 and by_arm["serial"].rejected_edits == 4
    e, s = by_arm["ecdysis"], by_arm["serial"]
    assert e.speedup_vs_serial == pytest.approx(s.train_wall_s / e.train_wall_s)
    assert e.executions_ratio_vs_serial == pytest.approx(s.agent_executions / e.agent_executions)
    assert by_arm["direct"].test_gain_vs_fixed is None  # fixed scored 0: no ratio to report
    assert by_arm["ecdysis"].test_delta_vs_fixed == pytest.approx(e.test_acc - by_arm["fixed"].test_acc)
    assert 1 <= by_arm["best-of-k"].k <= 8
    json_path, csv_path = write_results(results, tmp_path / "out")
    assert csv_path.read_text().count("\n") == len(ARMS) + 1 and json_path.exists()


async def test_unknown_arm(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"))
    with pytest.raises(ValueError, match="unknown arm"):
        await compare(ws.config, ["fixed", "magic"], open_workspace=lambda cfg: ws)


async def test_each_arm_accounts_its_own_optimizer_calls(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=2")
    results = {r.arm: r for r in await compare(ws.config, ["serial", "ecdysis"], open_workspace=lambda cfg: ws)}
    assert results["serial"].optimizer_calls == 2  # one diagnose-and-edit call per failure, capped at 2
    assert results["ecdysis"].optimizer_calls == 7  # 2 passes x 3 roles + the moderator


def _training_agent_hits(store: RunStore, arm: str) -> tuple[int, int]:
    run = next(r["id"] for r in store.runs() if r["id"].startswith(f"train-{arm}"))
    trajs = [t for e in store.evaluations(run) if e["label"] == "train" for t in store.trajectories(e["id"])]
    return sum(t.model_calls for t in trajs), sum(t.cache_hits for t in trajs)


@pytest.mark.parametrize("isolate", [True, False])
async def test_arms_pay_for_their_own_training_unless_sharing_is_asked(tmp_path: Path, isolate: bool) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=1", f"cache.isolate_arms={str(isolate).lower()}")
    await compare(ws.config, ["serial", "ecdysis"], open_workspace=lambda cfg: ws)
    store = RunStore(ws.config.run.run_dir)
    calls, hits = _training_agent_hits(store, "ecdysis")
    assert calls > 0
    # ecdysis collects the seed on the same train tasks serial already ran: identical inputs
    assert hits == (0 if isolate else calls)
    if isolate:  # the same compare under another config (here: run dir) pays for its training again
        again = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"),
                        "train.rounds=1", "train.serial_max_edits=1", f'run.run_dir="{tmp_path / "again"}"')
        await compare(again.config, ["ecdysis"], open_workspace=lambda cfg: again)
        assert _training_agent_hits(RunStore(tmp_path / "again"), "ecdysis") == (calls, 0)


def answer_line(messages: list[Message]) -> str:
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    return f"Answer: {a + b}"


async def test_transfer_evaluates_every_frozen_harness_with_the_second_model(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"), "train.rounds=1")
    ws.backends["agent|scripted:transfer"] = ScriptedModel(answer_line, name="liner")
    results = {r.arm: r for r in await compare(ws.config, ["fixed", "ecdysis"], transfer_model="scripted:transfer",
                                                open_workspace=lambda cfg: ws)}
    assert results["fixed"].test_acc == 0.0 and results["fixed"].transfer_acc == 1.0
    assert results["ecdysis"].test_acc == 1.0 and results["ecdysis"].transfer_acc == 1.0
    store = RunStore(ws.config.run.run_dir)
    transfer_evals = store.evaluations("transfer-fixed-seed0")
    assert [e["model"] for e in transfer_evals] == [ScriptedModel(answer_line, name="liner").identity]
    assert transfer_evals[0]["n_tasks"] == ws.config.train.test_limit


async def test_serial_shows_a_failure_what_was_tried_for_it_before(tmp_path: Path) -> None:
    roles = Roles(spec=USELESS_SPEC)
    prompts: list[str] = []

    def spy(messages: list[Message]) -> str:
        prompts.append(messages[-1].content)
        return roles(messages)

    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), "train.rounds=2", "train.serial_max_edits=7")
    for role in ("analyst", "moderator"):
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(spy, name="roles")
    await compare(ws.config, ["serial"], open_workspace=lambda cfg: ws)
    assert len(prompts) == 7  # six failures in round 1, then the first again in round 2
    assert "(first attempt)" in prompts[0] and "(first attempt)" not in prompts[6]
    assert "r1/f0: add_rule Be careful with arithmetic. -> rejected" in prompts[6]
