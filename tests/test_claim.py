"""Issue 38, the claim's experiment: charged time (deterministic from a cache, a cache hit charged like the call it
replays, the time budget checked between episodes), the seed evaluation shared by a compare seed's arms, serial's
targets in a seeded random order with `tried` reset after an accepted edit, and the factorial table over recorded
curves (the statistics alone: tests/test_compare_stats.py); the val score never falls back to the train score."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import BOXED_SPEC, ROLES, Roles, jsonl_project, registered_summary

from ecdysis.compare.factorial import Registration, factor_rows, factorial, factorial_report
from ecdysis.compare.results import ArmResult, add_ratios
from ecdysis.compare.run import compare
from ecdysis.config import load_config
from ecdysis.models import ChatRequest, Message, MeteredModel, ResponseCache, ScriptedModel
from ecdysis.models.base import user
from ecdysis.models.charge import RATES_ENV, rates
from ecdysis.store import RunStore
from ecdysis.trainer import records, train_async
from ecdysis.trainer.records import CurvePoint, SerialEdit
from ecdysis.trainer.targets import target_order
from ecdysis.workspace import Workspace

USELESS_SPEC = {**BOXED_SPEC, "changes": [{"layer": "H3", "kind": "add_rule", "file": "", "text": "Be careful.",
                                           "repair": "", "value": 0, "rationale": "care"}]}


def number(messages: list[Message]) -> int:
    return int(re.findall(r"\d+", messages[-1].content)[0])


def boxed(messages: list[Message]) -> str:
    i = number(messages)
    return f"So \\boxed{{{2 * i + 3}}}"


def project(tmp_path: Path, run_dir: Path, agent: ScriptedModel, roles: Roles, *overrides: str,
            wrong: str | None = None) -> Workspace:
    """Train t0..t5, val v0..v3, test x0..x3 ("Add i and i+3."); `wrong`: a train task whose gold no reply has."""
    rows = [{"id": f"{s}{k}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3) if f"{s}{k}" != wrong
             else "-1", "split": split}
            for s, split, base, n in (("t", "train", 0, 6), ("v", "val", 10, 4), ("x", "test", 20, 4))
            for k, i in enumerate(range(base, base + n))]
    cfg = load_config(None, [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"',
                             f'run.run_dir="{run_dir}"', "train.train_limit=6", "train.test_limit=4",
                             f'cache.path="{tmp_path / "c.sqlite"}"', *overrides])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = agent
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(roles, name="roles")
    return ws


@pytest.fixture
def rate_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Rates for the scripted models: 1 s per call plus 0.01 s per fresh prompt token and 0.1 s per generated one."""
    path = tmp_path / "rates.toml"
    path.write_text('version = "test"\n[sandbox]\nepisode_s = 0.5\n'
                    '[models."scripted:agent"]\nprompt_tok_s = 100\ngen_tok_s = 10\ncall_s = 1.0\n'
                    '[models."scripted:roles"]\nprompt_tok_s = 100\ngen_tok_s = 10\ncall_s = 2.0\n')
    monkeypatch.setenv(RATES_ENV, str(path))
    return path


# ---- charged time --------------------------------------------------------------------------------------------

async def test_a_cache_hit_is_charged_what_the_call_cost_when_it_ran(tmp_path: Path, rate_file: Path) -> None:
    cache = ResponseCache(tmp_path / "cache.sqlite")
    rated = MeteredModel(ScriptedModel(["four words of reply"], name="agent"), cache=cache)
    request = ChatRequest(messages=[user("one two three")])
    fresh, hit = await rated.chat(request), await rated.chat(request)
    assert not fresh.cache_hit and hit.cache_hit and hit.latency_s == 0.0
    assert fresh.charged_s == pytest.approx(1.0 + 3 / 100 + 4 / 10) and hit.charged_s == fresh.charged_s
    assert fresh.request_key == hit.request_key != ""
    # a model without a rate (a hosted endpoint) is charged its recorded latency, also when served from the cache
    slow = MeteredModel(ScriptedModel(["ok"], name="hosted", delay_s=0.05), cache=cache)
    first, again = await slow.chat(request), await slow.chat(request)
    assert first.charged_s >= 0.05 and again.cache_hit and again.charged_s == first.charged_s
    # a run pays for one distinct request once (the repeat is what a cold run serves from its own cache)
    store = RunStore(tmp_path / "run")
    for r in (fresh, hit, first, again):
        store.record_call("run", "e1", "agent", r.model_id, r.usage.prompt_tokens, r.usage.completion_tokens,
                          r.latency_s, 0.0, r.cache_hit, 0, r.charged_s, r.request_key)
    store.record_call("run", None, "analyst", "m", 1, 1, 0.0, 0.0, False, 0, 3.0, "")  # no cache: always paid
    store.record_call("run", None, "analyst", "m", 1, 1, 0.0, 0.0, False, 0, 3.0, "")
    assert store.charged_calls("run", ["e1"]) == pytest.approx(fresh.charged_s + first.charged_s + 6.0)
    assert store.charged_calls("run", []) == pytest.approx(6.0)  # another run's evaluations are not its own
    by_role = {role: s for role, (s, _) in store.paid_calls_by_role("run", ["e1"]).items()}  # where the time went
    assert by_role == {"agent": pytest.approx(fresh.charged_s + first.charged_s), "analyst": pytest.approx(6.0)}


def _ws(tmp_path: Path, run_dir: str, *overrides: str) -> Workspace:
    return project(tmp_path, tmp_path / run_dir, ScriptedModel(boxed, name="agent", delay_s=0.002),
                   Roles(spec=USELESS_SPEC), "train.rounds=2", "train.serial_max_edits=2",
                   "train.engine.skip_debate_when_verified=false", *overrides)


async def test_charged_time_is_the_same_when_a_compare_is_rerun_from_its_cache(tmp_path: Path) -> None:
    """No rate table entry: the scripted models are charged their measured latency (different on every fresh
    run); a second compare in a new run directory is served entirely from the first one's cache and charges
    exactly what the first did, point by point."""
    runs, spent = [], []
    for run_dir in ("cold", "from-cache"):
        ws = _ws(tmp_path, run_dir)
        results = await compare(ws.config, ["serial", "aggregate"], open_workspace=lambda cfg, ws=ws: ws)
        runs.append({(r.arm, p.step): (p.charged_s, p.wall_s) for r in results for p in r.curve})
        spent.append({r.arm: (r.cold_tokens, r.agent_tokens + r.optimizer_tokens) for r in results})
        ws.close()
    cold, warm = runs
    # tokens as a cold run spends them are the same from the cache; the fresh ones are not (nothing ran fresh)
    assert {a: t for a, (t, _) in spent[0].items()} == {a: t for a, (t, _) in spent[1].items()}
    assert all(t > 0 for t, _ in spent[1].values()) and all(fresh == 0 for _, fresh in spent[1].values())
    assert cold.keys() == warm.keys() and len(cold) >= 4
    for key, (charged, _) in cold.items():
        assert charged is not None and charged > 0
        assert warm[key][0] == pytest.approx(charged, rel=1e-9, abs=1e-12), key
    store = RunStore(tmp_path / "from-cache")
    served = store._rows("SELECT COUNT(*) AS n, SUM(cache_hit) AS h FROM model_calls WHERE eval_id IS NULL "
                         "OR eval_id IN (SELECT id FROM evaluations WHERE split != 'test')")[0]
    assert served["n"] > 0 and served["h"] == served["n"]  # every training call of the rerun was a cache hit
    # the cold run recorded which replies were generated under a grammar: the roles' JSON, not the agent's text
    fresh = RunStore(tmp_path / "cold").fresh_calls()
    roles = [c for c in fresh if c.role != "agent"]
    assert roles and all(c.constrained_tokens == c.completion_tokens > 0 for c in roles)
    assert all(c.constrained_tokens == 0 for c in fresh if c.role == "agent")


async def test_a_compare_resumed_on_another_machine_from_an_exported_cache_is_charged_the_same(
        tmp_path: Path) -> None:
    """`ecdysis cache export` on the first machine, `ecdysis cache import` into an empty cache on the next: the
    compare run there in a new run directory makes no training call to the model and charges what the first did."""
    from typer.testing import CliRunner

    from ecdysis.cli.main import app

    points = []
    for run_dir, cache in (("first", "c.sqlite"), ("next", "next.sqlite")):
        if run_dir == "next":
            moved = tmp_path / "carried.jsonl.gz"
            for args in (["export", str(moved), "--cache", str(tmp_path / "c.sqlite")],
                         ["import", str(moved), "--cache", str(tmp_path / cache)]):
                out = CliRunner().invoke(app, ["cache", *args], terminal_width=200)
                assert out.exit_code == 0, out.output
            assert re.search(r"imported (\d+) of \1 cache entries", out.output), out.output
        ws = _ws(tmp_path, run_dir, f'cache.path="{tmp_path / cache}"')
        results = await compare(ws.config, ["serial", "aggregate"], open_workspace=lambda cfg, ws=ws: ws)
        points.append({(r.arm, p.step): p.charged_s for r in results for p in r.curve})
        ws.close()
    assert points[0].keys() == points[1].keys() and len(points[0]) >= 4
    assert all(points[1][k] == pytest.approx(v, rel=1e-9, abs=1e-12) for k, v in points[0].items())
    served = RunStore(tmp_path / "next")._rows(
        "SELECT COUNT(*) AS n, SUM(cache_hit) AS h FROM model_calls WHERE eval_id IS NULL "
        "OR eval_id IN (SELECT id FROM evaluations WHERE split != 'test')")[0]
    assert served["n"] > 0 and served["h"] == served["n"]


async def test_every_steps_charged_time_is_filed_under_what_the_step_came_to(tmp_path: Path, rate_file: Path
                                                                              ) -> None:
    """Each training step costs its curve point's charged seconds less the previous point's, filed under
    accepted / validated, rejected / nothing new built / cut short: the parts add up to the curve, the accepted
    steps are the arm's accepted edits, and a row written before rows named them gets them back from the store."""
    from ecdysis.compare.files import read_results, write_results
    from ecdysis.compare.outcomes import outcome_table
    from ecdysis.trainer.records import STEP_OUTCOMES, RoundRecord, step_outcome

    ws = project(tmp_path, tmp_path / "run", ScriptedModel(boxed, name="agent"), Roles(spec=USELESS_SPEC),
                 "train.rounds=3", "train.serial_max_edits=4", wrong="t1")  # t1: no reply has its gold
    results = await compare(ws.config, ["serial", "aggregate"], open_workspace=lambda cfg, ws=ws: ws)
    ws.close()
    seen = set()
    for r in results:
        assert r.step_outcomes and set(r.step_outcomes) <= set(STEP_OUTCOMES), r.arm
        seconds = sum(s for s, _ in r.step_outcomes.values())
        assert seconds == pytest.approx(r.curve[-1].charged_s - r.curve[0].charged_s, abs=1e-6), r.arm
        assert sum(n for _, n in r.step_outcomes.values()) == len(r.curve) - 1
        assert r.step_outcomes.get("accepted", [0, 0])[1] == r.accepted_edits
        seen |= set(r.step_outcomes)
    assert {"validated, rejected", "nothing new built"} <= seen  # the useless rule: validated once, then rebuilt
    write_results(results, tmp_path / "run")  # what `ecdysis compare` writes beside its store
    rows = json.loads((tmp_path / "run" / "compare.json").read_text())
    (tmp_path / "run" / "compare.json").write_text(json.dumps([{k: v for k, v in row.items() if k != "step_outcomes"}
                                                               for row in rows]))
    again = {r.arm: r.step_outcomes for r in read_results(tmp_path / "run")}
    assert again == {r.arm: r.step_outcomes for r in results}
    write_results(results, tmp_path / "exported")  # an export without its store keeps what the rows say
    assert {r.arm: r.step_outcomes for r in read_results(tmp_path / "exported")} == again
    table = outcome_table(results)  # compare-summary's: mean charged s (steps) per seed, a row per arm
    assert table is not None and [c.header for c in table.columns][:3] == ["arm", "seeds", "accepted"]
    serial = results[0].step_outcomes["nothing new built"]
    # serial, as published, gets no library lever added to the useless rule: validated once, rebuilt 3 times
    assert list(table.columns[0].cells) == ["serial", "aggregate"] and serial[1] == 3
    assert list(table.columns[1].cells) == ["1 of 1", "1 of 1"]
    assert f"{serial[0]:.0f} (3.0)" in list(table.columns[4].cells)
    cut = RoundRecord(round=1, harness_before="a", harness_after="a", train_score=0.0, candidate="b",
                      decision_taken=False)
    assert step_outcome(cut) == "cut short"
    assert step_outcome(SerialEdit(task="t0", harness=None)) == "nothing new built"
    assert step_outcome(SerialEdit(task="t0", harness="b")) == "validated, rejected"


def test_a_step_after_a_point_without_charged_seconds_is_left_out(tmp_path: Path) -> None:
    """A run resumed across the version that began recording charged seconds: its older points have none, and
    the first step after them is not charged the whole running total."""
    from ecdysis.trainer.charged import charged_by_outcome
    from ecdysis.trainer.records import RoundRecord

    store = RunStore(tmp_path)
    for step, charged, accepted in ((0, None, False), (1, None, True), (2, 1000.0, False), (3, 1010.0, False)):
        records.put(store, "run", f"curve/{step:04d}", CurvePoint(
            arm="aggregate", step=step, harness_id="h", val_score=0.5, train_score=None, wall_s=0.0,
            agent_executions=0, cached_executions=0, optimizer_calls=0, optimizer_tokens=0, accepted=accepted,
            charged_s=charged))
        key = "seed" if step == 0 else f"r{step}"
        store.put_record("run", "curve-of", key, step)
        if step:
            records.put(store, "run", key, RoundRecord(round=step, harness_before="h", harness_after="h",
                                                       train_score=0.0, accepted=accepted,
                                                       candidate="c" if step == 2 else None))
    assert charged_by_outcome(store, "run") == {"nothing new built": (10.0, 1)}
    store.close()


async def test_the_time_budget_stops_an_evaluation_between_episodes(tmp_path: Path, rate_file: Path) -> None:
    """Each agent call is charged 1 + 25/100 + 2/10 = 1.45 s: a 3.5 s budget lets the seed's train evaluation
    (6 tasks, one at a time) start 3 episodes (0, 1.45, 2.9 s spent when they start), not 6; the run stops on
    the budget."""
    ws = _ws(tmp_path, "run", "run.concurrency=1", "train.budget.wall_s=3.5")
    result = await train_async(ws.config, "aggregate", ws=ws)
    seed = ws.harness().id
    (train_eval,) = [e for e in ws.store.evaluations(result.run_id) if e["harness_id"] == seed and
                     e["split"] == "train"]
    assert len(ws.store.trajectories(train_eval["id"])) == 3
    assert result.stop_reason.startswith("budget spent: wall_s")
    assert 3.5 <= result.charged_s <= 3.5 + 2 * (1.0 + 0.5 + 1)  # at most the episode in flight past the limit


async def test_the_seed_evaluation_runs_once_per_compare_seed_and_every_curve_starts_at_its_cost(
        tmp_path: Path, rate_file: Path) -> None:
    ws = _ws(tmp_path, "run")
    seed = ws.harness().id
    results = await compare(ws.config, ["serial", "aggregate", "ecdysis"], open_workspace=lambda cfg: ws)
    starts = {(r.curve[0].charged_s, r.curve[0].agent_executions, r.curve[0].val_score) for r in results}
    assert len(starts) == 1 and next(iter(starts))[0] > 0
    for r in results:  # where each arm's charged time went adds up to it: the agent, each role, the sandbox
        assert sum(r.charged_parts.values()) == pytest.approx(r.train_charged_s, abs=0.01), r.charged_parts
        assert r.charged_parts["agent"] > 0 and r.charged_parts["sandbox"] > 0
    assert {"analyst", "critic", "moderator"} <= set(next(r for r in results if r.arm == "ecdysis").charged_parts)
    store = RunStore(tmp_path / "run")
    seed_evals = [e for r in store.runs() for e in store.evaluations(r["id"]) if e["harness_id"] == seed
                  and e["split"] in ("train", "val")]
    assert {e["run_id"] for e in seed_evals} == {next(r["id"] for r in store.runs() if r["kind"] == "seed-eval")}
    episodes = sum(len(store.trajectories(e["id"])) for e in seed_evals)
    assert episodes == 6 + 4  # train and val, once for the three arms


# ---- serial's targets -------------------------------------------------------------------------------------------

def test_targets_come_in_a_seeded_random_order() -> None:
    ids = [f"{family}-{i}" for family in ("arith", "fact", "seq") for i in range(6)]
    assert target_order(ids, 0, "r1") == target_order(list(reversed(ids)), 0, "r1")  # the same seed, the same order
    orders = {tuple(target_order(ids, seed, "r1")) for seed in range(5)}
    assert len(orders) == 5  # another seed, another order
    assert all(list(o) != sorted(ids) for o in orders)  # never one family after another
    assert target_order(ids, 0, "r1") != target_order(ids, 0, "r1/f1")  # a new evaluation draws anew


def _seed_where_the_first_target_is_the_first_id(ids: list[str]) -> int:
    return next(s for s in range(200) if target_order(ids, s, "r1")[0] == sorted(ids)[0])


async def test_serial_takes_its_targets_in_the_seeded_order_and_tries_them_again_after_an_accepted_edit(
        tmp_path: Path) -> None:
    """Every reply is boxed (the seed rejects it) and t0's gold no reply has: the first edit (the boxed repair)
    is accepted and t0 still fails. Its first target is t0, so the second edit targets t0 again (a failure of
    the new harness); kept in `tried`, it would not be."""
    ids = [f"t{k}" for k in range(6)]
    seed = _seed_where_the_first_target_is_the_first_id(ids)
    ws = project(tmp_path, tmp_path / "run", ScriptedModel(boxed, name="agent"), Roles(), "train.rounds=1",
                 "train.serial_max_edits=3", f"run.seed={seed}", "train.engine.skip_debate_when_verified=false",
                 wrong="t0")
    result = await train_async(ws.config, "serial", ws=ws)
    edits = [e for _, e in records.load_all(ws.store, result.run_id, SerialEdit)]
    assert edits[0].task == target_order(ids, seed, "r1")[0] == "t0" and edits[0].accepted
    assert edits[1].task == "t0"


async def test_serial_targets_are_not_taken_in_id_order(tmp_path: Path) -> None:
    ids = [f"t{k}" for k in range(6)]
    seed = next(s for s in range(200) if target_order(ids, s, "r1")[0] != "t0")
    ws = project(tmp_path, tmp_path / "run", ScriptedModel(lambda m: "So \\boxed{999}", name="agent"),
                 Roles(spec=USELESS_SPEC), "train.rounds=1", "train.serial_max_edits=2", f"run.seed={seed}",
                 "train.engine.skip_debate_when_verified=false")
    result = await train_async(ws.config, "serial", ws=ws)
    assert [e.task for e in result.rounds[0].edits][:1] == target_order(ids, seed, "r1")[:1] != ["t0"]


# ---- the factorial table (the statistics on known inputs: tests/test_compare_stats.py) ---------------------------


def _point(arm: str, step: int, time: float, val: float | None, train: float | None = None) -> CurvePoint:
    return CurvePoint(arm=arm, step=step, harness_id=f"{arm}{step}", val_score=val, train_score=train, wall_s=time,
                      agent_executions=step, cached_executions=0, optimizer_calls=0, optimizer_tokens=0,
                      accepted=step > 0, charged_s=time)


def test_the_factorial_summary_censors_arms_that_miss_the_target_instead_of_dropping_them() -> None:
    results = []
    for seed in (0, 1):
        serial = [_point("serial", 0, 100, 0.2), _point("serial", 1, 400 + 100 * seed, 0.6)]
        never = [_point("aggregate", 0, 100, 0.2), _point("aggregate", 1, 200, 0.4)]
        results += [ArmResult("serial", seed, test_acc=0.5, curve=serial, budget_s=600.0,
                              test_per_task={"a": 1.0, "b": 0.0}),
                    ArmResult("aggregate", seed, test_acc=0.5, curve=never, budget_s=600.0,
                              test_per_task={"a": 1.0, "b": 1.0})]
    rows, tau, source = factorial(results, target=0.6, reps=200)
    by = {r.arm: r for r in rows}
    assert (tau, source) == (600.0, "train.budget.wall_s")
    assert by["aggregate"].reached == 0 and by["aggregate"].time_to_target is not None
    assert by["aggregate"].time_to_target.value == 600.0 and by["aggregate"].time_to_target.n == 2  # censored
    assert by["serial"].reached == 2 and by["serial"].time_to_target.value == pytest.approx(450.0)
    assert by["aggregate"].speedup_vs["serial"].value == pytest.approx(450.0 / 600.0)
    assert by["aggregate"].test_vs["serial"].value == pytest.approx(0.5)  # paired: b flips on both seeds
    assert by["serial"].auc.value == pytest.approx(((0.2 * 400 + 0.6 * 200) + (0.2 * 500 + 0.6 * 100)) / 2 / 600)


def test_the_summary_names_every_arm_that_stopped_before_the_budget(tmp_path: Path) -> None:
    """The registered stop rule is the budget alone: an arm ended earlier by a round limit (or any other rule) is
    named with its reason, whether it had reached the target, and written to factorial.json; one that ran to the
    budget is not."""
    ran_out = ArmResult("serial", 0, curve=[_point("serial", 0, 100, 0.2), _point("serial", 1, 500, 0.4)],
                        budget_s=600.0, train_charged_s=612.0, stop_reason="budget spent: wall_s 612/600")
    capped = ArmResult("aggregate", 0, curve=[_point("aggregate", 0, 100, 0.2), _point("aggregate", 1, 200, 0.4)],
                       budget_s=600.0, train_charged_s=300.0, stop_reason="round limit reached")
    there = ArmResult("ecdysis", 0, curve=[_point("ecdysis", 0, 100, 0.2), _point("ecdysis", 1, 250, 0.7)],
                      budget_s=600.0, train_charged_s=250.0, stop_reason="no edit accepted in 2 rounds in a row")
    report = factorial_report([ran_out, capped, there], Registration(target=0.6, budget_s=600.0))
    assert [(e.arm, e.charged_s, e.reached) for e in report.early] == [("aggregate", 300.0, False),
                                                                        ("ecdysis", 250.0, True)]
    text = report.early_text() or ""
    assert "aggregate seed 0: stopped at 300 of 600 charged s, without reaching the target: round limit reached" in text
    assert "ecdysis seed 0" in text and "serial" not in text.split("\n", 1)[1]
    report.write(tmp_path / "factorial.json")
    written = json.loads((tmp_path / "factorial.json").read_text())["early_stops"]
    assert [e["reason"] for e in written] == ["round limit reached", "no edit accepted in 2 rounds in a row"]
    assert factorial_report([ran_out], Registration(target=0.6, budget_s=600.0)).early_text() is None


def test_each_factor_is_the_arm_with_it_against_the_arm_without_it() -> None:
    """Library: serial+library vs serial; aggregation: aggregate vs serial+library; debate: ecdysis vs aggregate.
    Known curves: the target 0.6 reached at 400 / 200 / 100 / 100 charged s on both seeds."""
    reach = {"serial": 400, "serial+library": 200, "aggregate": 100, "ecdysis": 100}
    tests = {"serial": 0.0, "serial+library": 0.0, "aggregate": 1.0, "ecdysis": 1.0}
    results = [ArmResult(arm, seed, curve=[_point(arm, 0, 50, 0.2), _point(arm, 1, at, 0.6)], budget_s=600.0,
                         test_per_task={"a": tests[arm], "b": 1.0})
               for seed in (0, 1) for arm, at in reach.items()]
    factors = {f.factor: f for f in factor_rows(results, target=0.6, tau=600.0, reps=200)}
    assert list(factors) == ["library", "aggregation", "debate"]
    assert factors["library"].speedup.value == pytest.approx(2.0) and factors["library"].test_diff.value == 0
    assert factors["aggregation"].speedup.value == pytest.approx(2.0)
    assert factors["aggregation"].test_diff.value == pytest.approx(0.5)  # task a flips, b does not
    assert factors["aggregation"].auc_diff.value == pytest.approx(0.4 * 100 / 600)  # 0.6 instead of 0.2 for 100 s
    assert factors["debate"].speedup.value == pytest.approx(1.0) and factors["debate"].auc_diff.value == 0
    # an arm that did not run leaves its factors out
    assert [f.factor for f in factor_rows([r for r in results if r.arm != "aggregate"], 0.6, 600.0)] == ["library"]


def test_a_missing_val_score_never_falls_back_to_the_train_score() -> None:
    """A validation cut by the budget leaves the point without a val score: the arm has not reached serial's
    val accuracy there, whatever its train score."""
    serial = ArmResult("serial", 0, harness_id="serial1",
                       curve=[_point("serial", 0, 100, 0.25, 0.0), _point("serial", 1, 500, 0.5, 0.5)])
    arm = ArmResult("ecdysis", 0, harness_id="ecdysis2",
                    curve=[_point("ecdysis", 0, 100, 0.25, 0.0), _point("ecdysis", 1, 200, None, 1.0),
                           _point("ecdysis", 2, 300, 0.5, 1.0)])
    add_ratios([serial, arm])
    assert arm.time_to_serial_acc_s == 300.0 and arm.speedup_to_serial_acc == pytest.approx(500 / 300)


def test_rates_name_the_catalog_models_by_their_weights() -> None:
    from ecdysis.models.local_models import CATALOG

    table = rates()
    for name, spec in CATALOG.items():
        assert table.rate(f"llama.cpp:{spec.sha256}") == table.models[name]


def test_a_longer_context_costs_more_per_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention over a growing context: the same fresh tokens cost more after a long cached prefix, the same
    generated tokens more after a long prompt; without the context terms a rate is the plain linear one."""
    path = tmp_path / "ctx.toml"
    path.write_text('version = "ctx"\n[models."m"]\nprompt_tok_s = 100\ngen_tok_s = 10\ncall_s = 0.5\n'
                    'prompt_ctx_s = 4\ngen_ctx_s = 20\n[models."plain"]\nprompt_tok_s = 100\ngen_tok_s = 10\n')
    monkeypatch.setenv(RATES_ENV, str(path))
    m, plain = rates().models["m"], rates().models["plain"]
    assert m.seconds(1000, 0, 100) == pytest.approx(0.5 + 10 + 10 + 4 * 1000 * 500 / 1e6 + 20 * 100 * 1050 / 1e6)
    assert m.seconds(1100, 1000, 0) == pytest.approx(0.5 + 1 + 4 * 100 * 1050 / 1e6)  # fresh after a cached prefix
    assert m.seconds(2000, 1000, 0) > m.seconds(1000, 0, 0)  # the same fresh tokens, a longer context
    assert plain.seconds(1000, 200, 50) == pytest.approx(8 + 5)
    grammar = tmp_path / "grammar.toml"
    grammar.write_text('version = "g"\n[models."m"]\nprompt_tok_s = 100\ngen_tok_s = 10\nconstrained_s = 0.04\n')
    monkeypatch.setenv(RATES_ENV, str(grammar))
    g = rates().models["m"]  # tokens generated under a grammar (a role's JSON schema) cost more each
    assert g.seconds(100, 0, 50, constrained=50) == pytest.approx(1 + 5 + 50 * 0.04)
    assert g.seconds(100, 0, 50) == pytest.approx(1 + 5)


def test_a_bad_rates_file_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ecdysis.models.charge import RatesError

    path = tmp_path / "bad.toml"
    path.write_text('[models."m"]\nprompt_tok_s = "fast"\ngen_tok_s = 1\n')
    monkeypatch.setenv(RATES_ENV, str(path))
    with pytest.raises(RatesError, match=r"bad.toml.*prompt_tok_s"):
        rates()
    path.write_text('[models."m"]\nprompt_tok_s = 1\ngen_tok_s = 1\ngen_ctx_s = -2\n')
    with pytest.raises(RatesError, match=r"bad.toml.*gen_ctx_s"):
        rates()


def test_compare_summary_prints_the_factorial_table(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ecdysis.cli.main import app
    from ecdysis.compare.files import write_results

    curve = [_point("serial", 0, 100, 0.2), _point("serial", 1, 300, 0.6)]
    parts = [{"agent": 220.0, "sandbox": 10.0, "serial": 70.0}, {"agent": 180.0, "sandbox": 10.0, "serial": 110.0}]
    results = [ArmResult("serial", s, test_acc=0.5, curve=curve, budget_s=600.0, test_per_task={"a": 1.0},
                         charged_parts=parts[s], rates_version="7") for s in (0, 1)]
    printed, saved = registered_summary(tmp_path, results, "target = 0.6\nbudget_s = 500\n")
    assert "Factorial table: val target 0.6, budget τ = 500" in printed and "rate table 7)" in printed
    assert saved["budget_s"] == 500 and saved["rows"][0]["reached"] == 2 and saved["rates_version"] == "7"
    # where the time went, mean over the seeds: the seed evaluation (step 0) apart from the other episodes
    assert saved["rows"][0]["time_parts"] == {"seed evaluation": 100.0, "candidate episodes": 110.0, "serial": 90.0}
    assert "Where the charged time went" in printed and "Per factor" not in printed  # serial alone
    assert re.search(r"serial\s+│\s+100\s+│\s+110\s+│\s+90\s+│\s+300", printed), printed
    # a seed charged under another rate table does not pool with them: its charged seconds are another unit
    write_results([ArmResult("serial", 2, test_acc=0.5, curve=curve, rates_version="8")], tmp_path / "cmp8")
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), str(tmp_path / "cmp8"), "--target", "0.6"],
                             terminal_width=250)
    assert out.exit_code != 0 and "different rate tables (versions 7, 8)" in " ".join(out.output.split()), out.output


async def test_a_spec_that_rebuilds_a_rejected_harness_is_known_before_any_role_call(tmp_path: Path) -> None:
    """The check runs on the spec alone (no model call, no replay) and agrees with the real build."""
    from ecdysis.trainer.engine import Engine
    from ecdysis.trainer.evaluation import Measured
    from ecdysis.trainer.methods import method
    from ecdysis.trainer.proposers import Evidence
    from ecdysis.trainer.records import RoundRecord
    from ecdysis.trainer.spec import HarnessSpec

    roles = Roles()
    ws = project(tmp_path, tmp_path / "run", ScriptedModel(boxed, name="agent"), roles)
    engine = Engine(ws, "run", method("aggregate"))
    seed = ws.harness()
    ev = Evidence("r2", 2, seed, Measured(seed.id, "train", [], 1), [], [])
    spec, other = HarnessSpec.model_validate(BOXED_SPEC), HarnessSpec.model_validate(USELESS_SPEC)
    built = await engine.implementer().build(seed, spec, [])
    assert built.version is not None and not engine.rebuilds_rejected(spec, ev)
    records.put(ws.store, "run", "r1", RoundRecord(round=1, harness_before=seed.id, harness_after=seed.id,
                                                   train_score=0.0, candidate=built.version.id, accepted=False))
    assert engine.rebuilds_rejected(spec, ev) and not engine.rebuilds_rejected(other, ev)
    assert engine.no_new_try(ev)(spec) is True and engine.no_new_try(ev)(other) is False
    assert roles.calls == []  # nothing asked a role


def test_a_rates_file_that_replaces_the_builtin_table_is_named_alone(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with the sandbox and every built-in model charges nothing by the built-in table, so its name does
    not carry the built-in version (results pool across checkouts); a partial file's name does."""
    builtin = list(rates().models)
    whole = tmp_path / "whole.toml"
    whole.write_text('version = "w"\n[sandbox]\nepisode_s = 0.01\n' + "".join(
        f'[models."{m}"]\nprompt_tok_s = 100\ngen_tok_s = 10\n' for m in builtin))
    monkeypatch.setenv(RATES_ENV, str(whole))
    assert rates().version == "whole.toml:w"
    partial = tmp_path / "partial.toml"
    partial.write_text('version = "p"\n[sandbox]\nepisode_s = 0.01\n[models."m"]\nprompt_tok_s = 100\ngen_tok_s = 10\n')
    monkeypatch.setenv(RATES_ENV, str(partial))
    assert rates().version.endswith("+partial.toml:p") and rates().version != "partial.toml:p"
    monkeypatch.setenv(RATES_ENV, str(Path(__file__).parents[1] / "benchmarks/claim/rates-v4.toml"))
    assert rates().version == "rates-v4.toml:4"  # the claim experiment's table
