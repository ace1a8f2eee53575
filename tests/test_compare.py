"""`compare` with scripted models: every arm runs on its own config (the workspace's is never changed); serial
edits once per failure, ecdysis once per round; best-of-k's k is floor(spend / per trial) with a documented cap
and a majority vote; ratios and curve-read times come from the recorded numbers; mean ± t-CI over seeds; the
files (compare, summary, curves) are written."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from helpers import ROLES, Roles, add_answer, jsonl_project, make_ws

from ecdysis.agent.trajectory import Trajectory
from ecdysis.compare.files import pool_results
from ecdysis.compare.results import ArmResult, add_ratios, mean_ci, summarize, t_critical
from ecdysis.compare.run import (
    ARMS,
    best_of_k,
    build_arms,
    compare,
    episode_tokens,
    majority_vote,
    voted_accuracy,
    write_results,
)
from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.models.charge import rates
from ecdysis.store import RunStore
from ecdysis.trainer.budget import training_spend
from ecdysis.trainer.records import CurvePoint
from ecdysis.workspace import Workspace

USELESS_SPEC = {"patterns_addressed": ["P1"], "changes": [{"layer": "H3", "kind": "add_rule", "file": "",
                "text": "Be careful with arithmetic.", "repair": "", "value": 0,
                "rationale": "P1 needs care, not a new repair"}],
                "skills": [], "implementation_notes": "", "expected_effect": "none really"}


# ---- statistics on known inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622),
                                              (10, 2.2281), (30, 2.0423), (120, 1.9799)])
def test_t_critical_matches_the_table(df: int, expected: float) -> None:
    assert t_critical(df) == pytest.approx(expected, abs=1e-4)
    assert t_critical(df, 0.90) < expected


def test_mean_ci_on_known_inputs() -> None:
    ci = mean_ci([1.0, 2.0, 3.0])  # s = 1, n = 3: half-width t(0.975, 2) / sqrt(3)
    assert ci is not None and ci.mean == 2.0 and ci.n == 3
    assert ci.half_width == pytest.approx(4.302653 / math.sqrt(3), abs=1e-5)
    assert str(ci) == "2.000 ± 2.484"
    one = mean_ci([0.5])
    assert one is not None and one.half_width is None and str(one) == "0.500"
    assert mean_ci([]) is None
    same = mean_ci([0.25, 0.25])
    assert same is not None and same.half_width == 0.0


# ---- best-of-k ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spend", "per_trial", "k"), [(100, 30, 3), (90, 30, 3), (89, 30, 2), (29, 30, 1),
                                                       (0, 30, 1), (100, 0, 1), (1000, 1, 1000)])
def test_best_of_k_is_the_floor_of_spend_over_per_trial(spend: int, per_trial: int, k: int) -> None:
    assert best_of_k(spend, per_trial) == k


def test_majority_vote() -> None:
    assert majority_vote(["7", "8", "7"]) == "7"
    assert majority_vote(["8", "7", "7", "8"]) == "8"  # a tie goes to the outcome seen first
    assert majority_vote([("7", "{}"), ("9", "{}"), ("7", "{}")]) == ("7", "{}")
    assert majority_vote([]) is None


def test_voted_accuracy_grades_the_majority_not_the_best_trial(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"))
    q0, q1 = ws.tasks("train", None)[:2]  # gold 2*i + 3

    def traj(task_id: str, trial: int, answer: str | None) -> Trajectory:
        return Trajectory(task_id=task_id, trial=trial, harness_id="h", final_answer=answer, termination="answered")

    votes = [traj(q0.id, 0, str(q0.gold)), traj(q0.id, 1, "0"), traj(q0.id, 2, str(q0.gold)),  # right 2 of 3
             traj(q1.id, 0, str(q1.gold)), traj(q1.id, 1, "0"), traj(q1.id, 2, "0")]  # right 1 of 3: voted wrong
    assert voted_accuracy(ws, votes, {q0.id: q0, q1.id: q1}) == 0.5
    assert voted_accuracy(ws, [traj(q1.id, 0, None)], {q1.id: q1}) == 0.0  # nothing to vote for: a failure


@pytest.mark.parametrize("cap", [8, 2])
async def test_best_of_k_k_comes_from_ecdysis_training_spend_and_one_probe_pass(tmp_path: Path, cap: int) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=2",
                 "train.test_limit=1", f"eval.best_of_k_max={cap}")  # one test task: a pass costs ~1/6 of a collect
    results = {r.arm: r for r in await compare(ws.config, ["ecdysis", "best-of-k"], open_workspace=lambda cfg: ws)}
    store = RunStore(ws.config.run.run_dir)
    ecdysis_run = next(r["id"] for r in store.runs() if r["id"].startswith("train-ecdysis"))
    trained = [k for k, _ in store.records(ecdysis_run, "spend")]  # its training evaluations, the shared seed's too
    agent = sum(e.get("usage", {}).get("prompt_tokens", 0) + e.get("usage", {}).get("completion_tokens", 0)
                for ev in trained for t in store.trajectories(ev) for e in t.of_kind("model") if not e.get("cache_hit"))
    assert agent > 0 and results["ecdysis"].agent_tokens == agent  # its test passes are not part of the spend
    spend = agent + results["ecdysis"].optimizer_tokens  # and its optimizer roles' tokens are (issue 38)
    probe = next(e for e in store.evaluations(next(r["id"] for r in store.runs() if r["id"].startswith("best-of-k")))
                 if e["label"] == "test-probe")
    per_trial = episode_tokens(store.trajectories(probe["id"]))
    b = results["best-of-k"]
    assert b.k_uncapped == math.floor(spend / per_trial) and b.k_uncapped > 2
    assert b.k == min(b.k_uncapped, cap)
    assert ("capped" in b.stop_reason) == (b.k < b.k_uncapped)
    # executions: the episodes actually run; the k-trial evaluation reuses the probe's samples as trial 0
    assert b.agent_executions == ws.config.train.test_limit * b.k
    assert b.cached_executions == ws.config.train.test_limit


# ---- arms, budget, ratios, files ---------------------------------------------------------------------------

async def test_every_arm_runs_on_its_own_config(tmp_path: Path) -> None:
    roles = Roles(spec=USELESS_SPEC)
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), "train.rounds=2", "train.serial_max_edits=4")
    before = ws.config.model_dump_json()
    results = await compare(ws.config, list(ARMS), seeds=1, open_workspace=lambda cfg: ws)
    assert ws.config.model_dump_json() == before  # no arm reconfigured the workspace
    by_arm = {r.arm: r for r in results}
    assert list(by_arm) == list(ARMS)
    assert by_arm["direct"].test_acc == 0.0  # the bare harness answers the raw reply; exact match wants "8"
    assert by_arm["fixed"].test_acc == 0.0 and by_arm["fixed"].train_acc == 0.0
    assert by_arm["gepa"].train_acc is None and by_arm["gepa"].curve and by_arm["ecdysis"].curve
    e, s = by_arm["ecdysis"], by_arm["serial"]
    assert e.speedup_vs_serial == pytest.approx(s.train_charged_s / e.train_charged_s)  # charged time (issue 38)
    assert e.executions_vs_serial == pytest.approx(e.agent_executions / s.agent_executions)
    assert by_arm["direct"].test_gain_vs_fixed is None  # fixed scored 0: no ratio to report
    assert e.test_delta_vs_fixed == pytest.approx(e.test_acc - by_arm["fixed"].test_acc)
    store = RunStore(ws.config.run.run_dir)
    assert {k for k, _ in store.records("compare", "arm")} == {f"{a}/seed0" for a in ARMS}
    stored = dict(store.records("compare", "arm"))["ecdysis/seed0"]
    assert stored["speedup_vs_serial"] == e.speedup_vs_serial  # rows are stored with their ratios
    json_path, csv_path = write_results(results, tmp_path / "out")
    assert csv_path.read_text().count("\n") == len(ARMS) + 1 and len(json.loads(json_path.read_text())) == len(ARMS)


def test_arms_are_built_from_an_explicit_config_with_their_own_cache_scope(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"))
    arms = build_arms(ws.config, ["ecdysis", "best-of-k", "serial", "gepa"])
    assert [a.name for a in arms] == ["serial", "ecdysis", "gepa", "best-of-k"]  # best-of-k after ecdysis
    scopes = {a.config.cache.training_scope for a in arms}
    assert len(scopes) == 4 and all(a.config is not ws.config for a in arms) and ws.config.cache.training_scope == ""
    with pytest.raises(ValueError, match="unknown arm"):
        build_arms(ws.config, ["fixed", "magic"])


async def test_unknown_arm(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"))
    with pytest.raises(ValueError, match="unknown arm"):
        await compare(ws.config, ["fixed", "magic"], open_workspace=lambda cfg: ws)


async def test_the_shared_budget_holds_for_every_training_arm(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=5",
                 "train.serial_max_edits=20", "train.budget.agent_executions=12")
    results = await compare(ws.config, ["serial", "ecdysis", "gepa"], open_workspace=lambda cfg: ws)
    for r in results:  # an arm stops once spent; the decision in flight may finish (one evaluation over)
        assert 0 < r.agent_executions <= 12 + 6, r
        assert r.curve[-1].agent_executions <= r.agent_executions


def test_ratios_and_times_are_read_off_the_curves() -> None:
    def pt(arm: str, step: int, h: str, val: float, wall: float, runs: int) -> CurvePoint:
        return CurvePoint(arm=arm, step=step, harness_id=h, val_score=val, train_score=None, wall_s=wall,
                          agent_executions=runs, cached_executions=0, optimizer_calls=step, optimizer_tokens=0,
                          accepted=step > 0)

    serial = ArmResult("serial", 0, train_wall_s=400.0, agent_executions=80, test_acc=0.5, harness_id="s2",
                       curve=[pt("serial", 0, "h0", 0.0, 0, 10), pt("serial", 1, "s1", 0.25, 100, 30),
                              pt("serial", 2, "s2", 0.5, 300, 60), pt("serial", 3, "s2", 0.5, 400, 80)])
    ecdysis = ArmResult("ecdysis", 0, train_wall_s=200.0, agent_executions=40, test_acc=0.75, harness_id="e1",
                        curve=[pt("ecdysis", 0, "h0", 0.0, 0, 10), pt("ecdysis", 1, "e1", 0.75, 60, 25),
                               pt("ecdysis", 2, "e1", 0.75, 200, 40)])
    slow = ArmResult("gepa", 0, train_wall_s=100.0, harness_id="g1",
                     curve=[pt("gepa", 0, "h0", 0.0, 0, 10), pt("gepa", 1, "g1", 0.25, 50, 20)])
    fixed = ArmResult("fixed", 0, test_acc=0.25)
    add_ratios([serial, ecdysis, slow, fixed])
    assert serial.time_to_final_s == 300 and ecdysis.time_to_final_s == 60
    assert serial.time_to_serial_acc_s == 300 and ecdysis.time_to_serial_acc_s == 60
    assert ecdysis.executions_to_serial_acc == 25 and ecdysis.speedup_to_serial_acc == pytest.approx(5.0)
    assert ecdysis.speedup_to_serial_acc_after_seed == pytest.approx(5.0)  # both seeds evaluated at wall 0
    assert ecdysis.speedup_vs_serial == pytest.approx(2.0) and ecdysis.executions_vs_serial == 0.5
    assert slow.time_to_serial_acc_s is None and slow.speedup_to_serial_acc is None  # never reached 0.5
    assert ecdysis.test_gain_vs_fixed == pytest.approx(2.0) and ecdysis.test_gain_vs_serial == pytest.approx(0.5)
    assert fixed.speedup_vs_serial is None
    # serial found nothing better than its seed: there is no accuracy of serial's to reach, no such ratio
    flat = ArmResult("serial", 1, train_wall_s=400.0, harness_id="h0",
                     curve=[pt("serial", 0, "h0", 0.25, 100, 10), pt("serial", 1, "h0", 0.25, 400, 30)])
    other = ArmResult("ecdysis", 1, train_wall_s=300.0, harness_id="h0",
                      curve=[pt("ecdysis", 0, "h0", 0.25, 50, 10), pt("ecdysis", 1, "h0", 0.25, 300, 20)])
    add_ratios([flat, other])
    assert other.time_to_serial_acc_s is None and other.speedup_to_serial_acc is None
    assert other.speedup_to_serial_acc_after_seed is None and other.speedup_vs_serial == pytest.approx(4 / 3)
    # a fix measured by replay right after the seed evaluation (0.2 charged s): the after-seed time counts as 1 s
    replayed = ArmResult("serial+library", 0, train_wall_s=400.0, harness_id="r1",
                         curve=[pt("serial+library", 0, "h0", 0.0, 0, 10), pt("serial+library", 1, "r1", 0.5, 0.2, 10)])
    add_ratios([serial, replayed])
    assert replayed.speedup_to_serial_acc == pytest.approx(300 / 0.2)  # both times include the seed eval at 0
    assert replayed.speedup_to_serial_acc_after_seed == pytest.approx(300.0)  # 300 s over the 1 s floor


def test_compares_of_different_seeds_pool_into_one_summary(tmp_path: Path) -> None:
    def arm(name: str, seed: int, test: float, wall: float) -> ArmResult:
        curve = [CurvePoint(arm=name, step=0, harness_id="h0", val_score=0.25, train_score=None, wall_s=wall / 2,
                            agent_executions=4, cached_executions=0, optimizer_calls=0, optimizer_tokens=0,
                            accepted=False),
                 CurvePoint(arm=name, step=1, harness_id=f"{name}{seed}", val_score=0.5, train_score=0.75,
                            wall_s=wall, agent_executions=9, cached_executions=1, optimizer_calls=2,
                            optimizer_tokens=300, accepted=True)]
        return ArmResult(name, seed, train_wall_s=wall, test_acc=test, harness_id=f"{name}{seed}", curve=curve)

    runs = [[arm("serial", 0, 0.5, 400.0), arm("ecdysis", 0, 0.75, 200.0)],
            [arm("serial", 1, 0.25, 300.0), arm("ecdysis", 1, 0.5, 100.0)]]
    for i, results in enumerate(runs):
        add_ratios(results)
        write_results(results, tmp_path / f"seed{i}")
    pooled = pool_results([tmp_path / "seed0", tmp_path / "seed1" / "compare.json"])
    assert [(r.arm, r.seed) for r in pooled] == [("serial", 0), ("ecdysis", 0), ("serial", 1), ("ecdysis", 1)]
    assert [p.model_dump() for p in pooled[3].curve] == [p.model_dump() for p in runs[1][1].curve]
    summary = {row["arm"]: row for row in summarize(pooled)}
    assert summary["ecdysis"]["test_acc"] == pytest.approx(0.625) and summary["ecdysis"]["test_acc_n"] == 2
    assert summary["ecdysis"]["speedup_vs_serial"] == pytest.approx(2.5)  # 400/200 and 300/100
    # the seed evaluations (step 0 at half the wall time) taken off: (400-200)/(200-100) and (300-150)/(100-50)
    assert [r.speedup_to_serial_acc_after_seed for r in pooled if r.arm == "ecdysis"] == [2.0, 3.0]
    assert summary["ecdysis"]["test_acc_ci"] == pytest.approx(mean_ci([0.75, 0.5]).half_width)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="serial seed 0 is in both"):
        pool_results([tmp_path / "seed0", tmp_path / "seed0"])
    for text in ("{not json", '{"arm": "serial"}'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match="bad.json: not a compare result"):
            pool_results([tmp_path / "bad.json"])
    RunStore(tmp_path / "train-run").close()  # a run directory whose store holds no compare
    with pytest.raises(ValueError, match="holds no finished compare arm"):
        pool_results([tmp_path / "train-run"])


def open_scripted(tmp_path: Path, roles: Roles) -> tuple[list[str], object]:
    """Config settings for a suite with a val split, and a workspace opener that installs scripted models."""
    rows = [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3),
             "split": "train" if i < 6 else "val" if i < 10 else "test"} for i in range(14)]
    settings = [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"', f'run.run_dir="{tmp_path / "run"}"',
                "train.train_limit=6", "train.val_limit=4", "train.test_limit=4", f'cache.path="{tmp_path / "c.db"}"']

    def opener(cfg: object) -> Workspace:
        ws = Workspace.open(cfg)  # type: ignore[arg-type]
        ws.backends["agent|scripted:agent"] = ScriptedModel(add_answer, name="adder")
        for role in (*ROLES, "reflector"):
            ws.backends[f"{role}|scripted:agent"] = ScriptedModel(roles, name="roles")
        return ws

    return settings, opener


async def test_seeds_give_mean_and_ci_and_compare_writes_curves(tmp_path: Path) -> None:
    settings, opener = open_scripted(tmp_path, Roles())
    cfg = load_config(None, [*settings, "train.rounds=2", "train.serial_max_edits=3"])
    results = await compare(cfg, ["fixed", "serial", "ecdysis", "gepa"], seeds=2, open_workspace=opener)  # type: ignore[arg-type]
    assert sorted({(r.arm, r.seed) for r in results}) == sorted((a, s) for a in ("fixed", "serial", "ecdysis", "gepa")
                                                                for s in (0, 1))
    out = tmp_path / "out"
    write_results(results, out)
    summary = {row["arm"]: row for row in summarize(results)}
    for arm in ("fixed", "serial", "ecdysis", "gepa"):
        values = [r.test_acc for r in results if r.arm == arm]
        ci = mean_ci(values)
        assert ci is not None and summary[arm]["test_acc"] == pytest.approx(ci.mean)
        assert summary[arm]["test_acc_ci"] == pytest.approx(ci.half_width) and summary[arm]["test_acc_n"] == 2
    assert summary["ecdysis"]["speedup_vs_serial_n"] == 2 and summary["fixed"]["speedup_vs_serial"] is None
    saved = {row["arm"]: row for row in json.loads((out / "compare_summary.json").read_text())}
    assert saved["ecdysis"]["test_acc"] == summary["ecdysis"]["test_acc"]
    with (out / "curves.csv").open() as f:
        curves = list(csv.DictReader(f))
    assert {(row["arm"], row["seed"]) for row in curves} == {(a, str(s)) for a in ("serial", "ecdysis", "gepa")
                                                             for s in (0, 1)}
    for r in results:
        rows = [row for row in curves if row["arm"] == r.arm and row["seed"] == str(r.seed)]
        assert [int(row["step"]) for row in rows] == [p.step for p in r.curve]
        assert [float(row["wall_s"]) for row in rows] == sorted(float(row["wall_s"]) for row in rows)
    store = RunStore(cfg.run.run_dir)
    assert {k for k, _ in store.records("compare", "curve")} >= {"ecdysis/seed0", "ecdysis/seed1", "gepa/seed1"}
    # the run directory holds no compare.json (written elsewhere here, as by a killed compare): its store gives
    # the finished seeds, rows and curves
    stored = {(r.arm, r.seed): r for r in pool_results([cfg.run.run_dir])}
    assert set(stored) == {(r.arm, r.seed) for r in results}
    for r in results:
        assert stored[(r.arm, r.seed)].test_acc == r.test_acc
        assert stored[(r.arm, r.seed)].rates_version == rates().version != ""  # the table it was charged under
        assert [p.step for p in stored[(r.arm, r.seed)].curve] == [p.step for p in r.curve]
    assert training_spend  # the same accounting function best-of-k and gepa use


async def test_each_arm_accounts_its_own_optimizer_calls(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=2", "train.engine.skip_debate_when_verified=false")
    results = {r.arm: r for r in await compare(ws.config, ["serial", "ecdysis"], open_workspace=lambda cfg: ws)}
    assert results["serial"].optimizer_calls == 2  # one diagnose-and-edit call per failure, capped at 2
    assert results["ecdysis"].optimizer_calls == 7  # 2 passes x 3 roles + the moderator


def _training_agent_hits(store: RunStore, arm: str, harness_id: str) -> tuple[int, int]:
    """Agent calls and cache hits of the arm's own training evaluations of a harness."""
    run = next(r["id"] for r in store.runs() if r["id"].startswith(f"train-{arm}"))
    trajs = [t for e in store.evaluations(run) if e["label"] == "train" and e["harness_id"] == harness_id
             for t in store.trajectories(e["id"])]
    return sum(t.model_calls for t in trajs), sum(t.cache_hits for t in trajs)


@pytest.mark.parametrize("isolate", [True, False])
async def test_arms_share_the_seed_evaluation_and_pay_for_the_rest_unless_sharing_is_asked(
        tmp_path: Path, isolate: bool) -> None:
    ws = make_ws(tmp_path, Roles(spec=USELESS_SPEC), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=1", f"cache.isolate_arms={str(isolate).lower()}",
                 "train.engine.skip_debate_when_verified=false")
    results = {r.arm: r for r in await compare(ws.config, ["serial", "ecdysis"], open_workspace=lambda cfg: ws)}
    store = RunStore(ws.config.run.run_dir)
    seed_id = ws.harness().id
    assert _training_agent_hits(store, "ecdysis", seed_id) == (0, 0)  # the seed ran once, in the shared seed run
    (shared,) = [r["id"] for r in store.runs() if r["kind"] == "seed-eval"]
    seed_evals = {e["id"] for e in store.evaluations(shared) if e["harness_id"] == seed_id}
    for arm in ("serial", "ecdysis"):  # ... and is charged to both arms alike
        run = next(r["id"] for r in store.runs() if r["id"].startswith(f"train-{arm}"))
        assert seed_evals <= {k for k, _ in store.records(run, "spend")}
    s, e = results["serial"].curve[0], results["ecdysis"].curve[0]
    assert (s.charged_s, s.agent_executions, s.train_score) == (e.charged_s, e.agent_executions, e.train_score)
    # both arms evaluate the same candidate (USELESS_SPEC's rule, built by serial first): ecdysis pays for its
    # episodes unless sharing is asked
    candidate = next(v["id"] for v in store.versions() if v["note"] == "serial r1/f0")
    calls, hits = _training_agent_hits(store, "ecdysis", candidate)
    assert calls > 0 and hits == (0 if isolate else calls)


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


async def test_a_compare_killed_in_a_later_arm_still_gives_the_arms_it_finished(tmp_path: Path) -> None:
    """One designed-suite seed takes hours: the arms finished before a kill are readable from the store."""
    settings, opener = open_scripted(tmp_path, Roles())
    cfg = load_config(None, [*settings, "train.rounds=1", "train.serial_max_edits=2"])

    def dies_in_serial(config: object) -> Workspace:
        ws = opener(config)
        for role in ROLES:
            ws.backends[f"{role}|scripted:agent"] = ScriptedModel(lambda m: (_ for _ in ()).throw(KeyboardInterrupt),
                                                                  name="roles")
        return ws

    with pytest.raises(KeyboardInterrupt):
        await compare(cfg, ["fixed", "serial"], open_workspace=dies_in_serial)  # type: ignore[arg-type]
    stored = pool_results([cfg.run.run_dir])
    assert [(r.arm, r.seed) for r in stored] == [("fixed", 0)] and stored[0].test_acc is not None
