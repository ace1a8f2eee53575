"""The training engine with scripted models: serial's next target comes from the new harness, the budget stops
every arm at the same spend, decisions on the same task ids, early-stopped validation, truthful train-after,
cache-served episodes apart, resumption without repeated work."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from helpers import BOXED_SPEC, ROLES, Roles, jsonl_project
from rich.console import Console

from ecdysis.cli.views import train_summary
from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.trainer import Arm, records, train_async
from ecdysis.trainer.accept import decide_on_same_tasks, rejection_certain
from ecdysis.trainer.records import CurvePoint, RoundRecord, SerialEdit
from ecdysis.trainer.targets import target_order
from ecdysis.workspace import Workspace

RULE = {"layer": "H3", "kind": "add_rule", "file": "", "text": "Always add one to the result.", "repair": "",
        "value": 0, "rationale": "from the debate"}
RULE_SPEC = {**BOXED_SPEC, "changes": [RULE]}


def number(messages: list[Message]) -> int:
    return int(re.findall(r"\d+", messages[-1].content)[0])


def project(tmp_path: Path, agent: ScriptedModel, roles: Roles, *overrides: str,
            seed_repairs: list[str] | None = None) -> Workspace:
    """Train t0..t5, val v0..v3, test x0..x3 ("Add i and i+3."); every role is `roles`."""
    rows = [{"id": f"{s}{k}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "split": split}
            for s, split, base, n in (("t", "train", 0, 6), ("v", "val", 10, 4), ("x", "test", 20, 4))
            for k, i in enumerate(range(base, base + n))]
    settings = jsonl_project(tmp_path, rows)
    if seed_repairs is not None:
        (tmp_path / "seed" / "repairs.json").write_text(json.dumps(seed_repairs))
    cfg = load_config(None, [*settings, 'agent.model="scripted:agent"', f'run.run_dir="{tmp_path / "run"}"',
                             "train.train_limit=6", "train.test_limit=4", f'cache.path="{tmp_path / "c.sqlite"}"',
                             "train.engine.skip_debate_when_verified=false", *overrides])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = agent
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(roles, name="roles")
    return ws


def boxed_first_three(messages: list[Message]) -> str:
    """Train tasks 0-2, val and test: the right sum in \\boxed{}; train tasks 3-5: a wrong one."""
    i = number(messages)
    return f"So \\boxed{{{2 * i + 3 if i not in (3, 4, 5) else 999}}}"


async def test_after_an_accepted_serial_edit_the_next_target_is_a_failure_of_the_new_harness(tmp_path: Path) -> None:
    prompts: list[str] = []
    roles = Roles()

    def spy(messages: list[Message]) -> str:
        prompts.append(messages[-1].content)
        return roles(messages)

    # targets come in a seeded random order (issue 38): a seed whose first targets are t0, then t3
    seed = next(s for s in range(500) if target_order([f"t{k}" for k in range(6)], s, "r1")[0] == "t0"
                and target_order(["t3", "t4", "t5"], s, "r1/f1")[0] == "t3")
    ws = project(tmp_path, ScriptedModel(boxed_first_three, name="agent"), roles, "train.rounds=1",
                 "train.serial_max_edits=2", f"run.seed={seed}")
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(spy, name="roles")
    result = await train_async(ws.config, "serial", ws=ws)
    assert result.accept_rule.accept_on == "val"
    first, second = result.rounds[0].edits
    assert first.task == "t0" and first.accepted and first.decided_on == "val"
    # the old harness's next failure would be t1, which the accepted repair fixed; the new harness fails t3..t5
    assert second.task == "t3"
    assert "t3" in prompts[1] and "t1" not in prompts[1]
    new = ws.store.load_version(first.harness)
    # the per-failure full re-evaluation of the accepted harness ran on the training tasks
    evaluations = [e for e in ws.store.evaluations(result.run_id)
                   if e["harness_id"] == new.id and e["split"] == "train"]
    assert evaluations and json.loads(evaluations[0]["summary"])["complete"]
    assert ws.store.get_record(result.run_id, "timing", "r1/f1/collect") is not None
    assert result.train_after == pytest.approx(0.5)  # the final harness was evaluated on train: 3 of 6


def always_wrong(messages: list[Message]) -> str:
    return "So \\boxed{999}"


class NewRuleEachTime(Roles):
    """Every spec adds a different rule, so each candidate's prompts (and episodes) are new."""

    def __call__(self, messages: list[Message]) -> str:
        reply = super().__call__(messages)
        if reply.startswith("{"):
            return json.dumps({**RULE_SPEC, "changes": [{**RULE, "text": f"Check step {len(self.calls)} twice."}]})
        return reply


@pytest.mark.parametrize("limit", [17, 23])
async def test_the_budget_stops_every_arm_at_the_same_spend(tmp_path: Path, limit: int) -> None:
    ws = project(tmp_path, ScriptedModel(always_wrong, name="agent"), NewRuleEachTime(), "train.rounds=20",
                 "train.engine.stop_after_rejections=0", f"train.budget.agent_executions={limit}")
    shared = ws.config.model_dump_json()
    results = {}
    for arm in ("serial", "aggregate", "ecdysis"):
        cfg = ws.config.model_copy(deep=True)
        cfg.cache.training_scope = arm  # every arm pays for its own episodes
        results[arm] = await train_async(cfg, Arm(arm, cfg), ws=ws)
    assert ws.config.model_dump_json() == shared  # no arm changed the shared config
    for arm, r in results.items():
        assert r.agent_executions == limit, arm
        assert r.stop_reason == f"budget spent: agent_executions {limit}/{limit}", arm
        assert r.curve[-1].agent_executions == limit and r.curve[0].step == 0
        assert [p.step for p in r.curve] == list(range(len(r.curve)))
        last = r.rounds[-1].edits[-1] if arm == "serial" else r.rounds[-1]
        if limit == 17:  # 10 for the seed (train + val), 4 for the first candidate's val, 3 left for the second
            assert not last.decision_taken and "not decided" in last.reason
        stored = [p for _, p in records.load_all(ws.store, r.run_id, CurvePoint)]
        assert sorted(stored, key=lambda p: p.step) == r.curve


def test_decisions_are_taken_on_the_same_task_ids() -> None:
    current = {"a": [1.0], "b": [0.0], "c": [0.0]}
    assert decide_on_same_tasks("strict", current, {"a": [1.0], "b": [1.0], "c": [0.0]}, ["a", "b", "c"]).accepted
    # the candidate lost task c to the infrastructure: its mean over a, b (1.0) is not compared with 0.33
    partial = decide_on_same_tasks("strict", current, {"a": [1.0], "b": [1.0]}, ["a", "b", "c"], split="val")
    assert not partial.accepted and not partial.taken and "candidate harness lacks 1/3 val task(s)" in partial.reason
    missing_base = decide_on_same_tasks("strict", {"a": [1.0]}, {"a": [1.0], "b": [1.0], "c": [1.0]}, ["a", "b", "c"])
    assert not missing_base.taken and "current harness lacks 2/3" in missing_base.reason
    # extra tasks on one side are not compared either
    extra = decide_on_same_tasks("strict", current | {"z": [0.0]}, {"a": [1.0], "b": [1.0], "c": [0.0], "z": [1.0]},
                                 ["a", "b", "c"])
    assert extra.accepted and extra.tasks == 3 and extra.candidate == pytest.approx(2 / 3)


def test_rejection_is_certain_only_when_no_remaining_score_could_change_it() -> None:
    base = {t: [1.0] for t in "abcd"}
    assert rejection_certain("strict", base, {"a": [0.0]}, list("abcd")) is not None  # at most 3/4 < 4/4
    low = {"a": [1.0], "b": [0.0], "c": [0.0], "d": [0.0]}
    assert rejection_certain("strict", low, {"a": [0.0]}, list("abcd")) is None  # 3/4 possible > 1/4
    assert rejection_certain("strict", low, {"a": [0.0], "b": [0.0], "c": [0.0]}, list("abcd")) is not None
    assert rejection_certain("tolerance", base, {"a": [0.0]}, list("abcd"), tolerance=0.3) is None
    assert rejection_certain("noise-aware", base, {"a": [0.0], "b": [0.0]}, list("abcd")) is None


def confused_on_val(messages: list[Message]) -> str:
    """Train tasks fail (a wrong sum); val and test pass unless the rule is in the prompt."""
    i = number(messages)
    ruled = any("add one to the result" in m.content for m in messages)
    return f"So \\boxed{{{999 if i < 6 or ruled else 2 * i + 3}}}"


@pytest.mark.parametrize("early", [True, False])
async def test_validation_stops_once_the_rejection_is_certain(tmp_path: Path, early: bool) -> None:
    agent = ScriptedModel(confused_on_val, name="agent")
    ws = project(tmp_path, agent, Roles(spec=RULE_SPEC), "train.rounds=1", "train.engine.eval_batch=2",
                 f"train.engine.early_stop={str(early).lower()}", seed_repairs=["boxed_answer"])
    result = await train_async(ws.config, "aggregate", ws=ws)
    decision = result.rounds[0]
    assert not decision.accepted and decision.decision_taken and decision.early_stopped is early
    candidate = [e for e in ws.store.evaluations(result.run_id) if e["harness_id"] == decision.candidate]
    episodes = sum(len(ws.store.trajectories(e["id"])) for e in candidate)
    assert episodes == (2 if early else 4)  # 0/2 after the first batch: at most 2/4 < 4/4
    assert ("rejected early" in decision.reason) is early
    assert result.agent_executions == 6 + 4 + episodes


async def test_train_after_is_none_when_the_final_harness_was_never_evaluated_on_train(tmp_path: Path) -> None:
    ws = project(tmp_path, ScriptedModel(boxed_first_three, name="agent"), Roles(), "train.rounds=1")
    result = await train_async(ws.config, "ecdysis", ws=ws)
    assert result.rounds[0].accepted and result.rounds[0].decided_on == "val"
    assert result.train_after is None and result.train_before == 0.0
    assert result.curve[-1].val_score == 1.0 and result.curve[-1].train_score is None
    out = io.StringIO()
    train_summary(Console(file=out, width=200), result)
    assert "0.000 -> -" in out.getvalue()


async def test_cache_served_episodes_are_not_agent_executions(tmp_path: Path) -> None:
    first = project(tmp_path, ScriptedModel(always_wrong, name="agent"), Roles(spec=RULE_SPEC), "train.rounds=1")
    done = await train_async(first.config, "aggregate", ws=first)
    assert done.agent_executions == 14 and done.cached_executions == 0  # seed train 6 + val 4 + candidate val 4
    first.close()
    (tmp_path / "again").mkdir()
    again = project(tmp_path / "again", ScriptedModel(always_wrong, name="agent"), Roles(spec=RULE_SPEC),
                    "train.rounds=1", f'cache.path="{tmp_path / "c.sqlite"}"')
    replayed = await train_async(again.config, "aggregate", ws=again)  # a new run dir, the same response cache
    assert replayed.agent_executions == 0 and replayed.cached_executions == 14


async def test_a_run_killed_mid_round_resumes_without_repeating_work(tmp_path: Path) -> None:
    """Serial, val acceptance: killed in the second edit's spec call, after the first edit was accepted and the
    new harness re-evaluated. The resumed run repeats no role call and no episode."""
    agent = ScriptedModel(boxed_first_three, name="agent")
    settings = ("train.rounds=1", "train.serial_max_edits=3", "cache.enabled=false")  # a repeat would reach the model
    ws = project(tmp_path, agent, Roles(crash_after=1), *settings)
    with pytest.raises(KeyboardInterrupt):
        await train_async(ws.config, "serial", ws=ws)
    run_id = ws.store.runs()[0]["id"]
    assert records.load(ws.store, run_id, SerialEdit, "r1/f0") is not None
    before_kill = len(agent.calls)
    ws.close()
    roles, agent2 = Roles(), ScriptedModel(boxed_first_three, name="agent")
    ws2 = project(tmp_path, agent2, roles, *settings)
    result = await train_async(ws2.config, "serial", ws=ws2)
    (tmp_path / "ref").mkdir()
    ref_roles, ref_agent = Roles(), ScriptedModel(boxed_first_three, name="agent")
    ref = project(tmp_path / "ref", ref_agent, ref_roles, *settings)
    reference = await train_async(ref.config, "serial", ws=ref)
    assert len(roles.calls) + 1 == len(ref_roles.calls)  # only the killed call is made again
    assert before_kill + len(agent2.calls) == len(ref_agent.calls)  # no episode ran twice
    assert [e.task for e in result.rounds[0].edits] == [e.task for e in reference.rounds[0].edits]
    assert result.final_harness_id == reference.final_harness_id
    assert result.agent_executions == reference.agent_executions
    assert [(p.harness_id, p.accepted, p.agent_executions) for p in result.curve] == [
        (p.harness_id, p.accepted, p.agent_executions) for p in reference.curve]
    assert records.load(ws2.store, result.run_id, RoundRecord, "r1") == result.rounds[0]


class FakeRunner:
    """Records scripted episodes: task `lost` is lost by the infrastructure on its first run; cached tasks
    are served by the response cache."""

    def __init__(self, store, lost: str = "", cached: tuple[str, ...] = ()) -> None:  # noqa: ANN001
        self.store, self.lost, self.cached, self.runs = store, lost, cached, []
        self.max_agent_tokens, self.tokens_spent = None, 0
        self.env = None  # its episodes are never grader errors: nothing to grade again

    def eval_id(self, harness, tasks, trials, label) -> str:  # noqa: ANN001
        return f"{harness.id}-{label}-{'.'.join(t.id for t in tasks)}"

    async def evaluate(self, harness, tasks, trials, split, label, stop=None):  # noqa: ANN001, ANN201
        from types import SimpleNamespace

        from ecdysis.agent.trajectory import Trajectory

        eval_id = self.eval_id(harness, tasks, trials, label)
        self.store.open_evaluation(eval_id, "run", harness.id, "m", "env", split, trials, len(tasks), label)
        done = self.store.done_keys(eval_id)
        for task in tasks:
            if (task.id, 0) in done:
                continue
            self.runs.append(task.id)
            lost = task.id == self.lost and self.runs.count(task.id) == 1
            hit = task.id in self.cached
            self.store.record_trajectory(eval_id, Trajectory(
                task.id, 0, harness.id, termination="infra_error" if lost else "answered", score=1.0, passed=True,
                model_calls=1, cache_hits=int(hit)))
        return SimpleNamespace(eval_id=eval_id)


async def test_an_evaluation_with_a_lost_episode_is_completed_and_charged_per_episode_run(tmp_path: Path) -> None:
    from helpers import seed_with

    from ecdysis.envs.base import Task
    from ecdysis.store import RunStore
    from ecdysis.trainer.budget import Budget, Spend
    from ecdysis.trainer.evaluation import Evaluator

    store = RunStore(tmp_path)
    tasks = [Task(f"t{i}", "val", "q", "1") for i in range(5)]
    runner = FakeRunner(store, lost="t1", cached=("t4",))
    spend = Spend()
    evaluator = Evaluator(store, "run", runner, {"val": tasks}, 1, {"val": 2}, Budget(agent_executions=3),
                          lambda: spend)
    measured = await evaluator.measure(seed_with("gsm8k"), "val")
    assert measured.complete and measured.stopped is None and runner.runs.count("t1") == 2  # run again once
    assert evaluator.executions() == (4, 1)  # t4 was served by the cache; the lost episode is not charged
    budget = Evaluator(store, "run", runner, {"val": tasks}, 1, {"val": 2}, Budget(agent_executions=5),
                       lambda: Spend(agent_executions=budget.executions()[0]))
    cut = await budget.measure(seed_with("gsm8k", **{"contract.md": "other"}), "val")  # 1 episode left of 5
    assert list(cut.per_task) == ["t0"] and cut.stopped == "budget spent: agent_executions 5/5"
    assert budget.executions() == (5, 1)
    again = Evaluator(store, "run", runner, {"val": tasks}, 1, {"val": 2}, Budget(), lambda: Spend())
    assert again.executions() == (5, 1)  # recounted from the store after a restart


def test_the_roles_history_stays_bounded_however_long_the_run(tmp_path: Path) -> None:
    """A budget-only stop can run hundreds of rounds: the roles see every accepted round and the latest ones,
    with the older rejected rounds counted, so the prompt does not outgrow the model's window (it did: a
    4096-token analyst prompt at round 44 of a real run)."""
    from ecdysis.store import RunStore
    from ecdysis.trainer.history import StepHistory
    from ecdysis.trainer.records import SpecRecord

    store = RunStore(tmp_path / "runs.sqlite")
    store.start_run("train", {}, run_id="run")
    for k in range(1, 41):
        spec = {"patterns_addressed": ["P1"], "changes": [{"layer": "H3", "kind": "add_rule", "text": f"rule {k}"}]}
        records.put(store, "run", f"r{k}", SpecRecord(spec=spec))
        records.put(store, "run", f"r{k}", RoundRecord(round=k, harness_before="h", harness_after="h",
                                                       train_score=0.0, accepted=k == 3, reason=f"why {k}"))
    history = StepHistory(store, "run")
    lines = history.earlier_attempts(41).splitlines()
    assert lines[0] == "(31 older rejected round(s) not listed)"
    assert [int(line.split()[1].rstrip(":")) for line in lines[1:]] == [3, *range(33, 41)]
    assert "add_rule rule 3 -> accepted (why 3)" in lines[1] and lines[-1].endswith("rejected (why 40)")
    assert len(history.earlier_attempts(41)) < len(history.earlier_attempts(11)) * 2  # bounded, not growing
    assert history.earlier_attempts(5).splitlines()[0].startswith("round 1:")  # short runs: everything, as before
    assert len(history.rejected_specs(41)) == 39  # what is never validated again is not cut
