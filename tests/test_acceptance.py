"""Acceptance that knows its error rates: the exact paired test, the sequential rule's early accept and reject, its
false-accept rate on a seeded simulation, the exact-evidence path for H2 repairs, the decision record, the
split-size warning."""

from __future__ import annotations

import io
import json
import random
import re
from pathlib import Path

import pytest
from helpers import ROLES, Roles, jsonl_project, make_ws
from rich.console import Console

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.report.data import load_run
from ecdysis.trainer import records, train_async
from ecdysis.trainer.accept import ClassicRule, decide, make_rule, validate_in_batches
from ecdysis.trainer.exact import SplitReplay, decide_exact
from ecdysis.trainer.records import RoundRecord
from ecdysis.trainer.sequential import SequentialRule, exact_sign_test, run_looks, spending
from ecdysis.trainer.sizing import advise, power
from ecdysis.workspace import Workspace

IDS = [f"t{i:02d}" for i in range(64)]


@pytest.fixture(autouse=True)
def _close_workspaces(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202 - a generator fixture
    """Every workspace a test opens is closed after it: its sandbox workers and zygotes do not outlive the test
    (left running, they starved a later test's zygote)."""
    opened: list[Workspace] = []
    real = Workspace.open

    def tracking(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        ws = real(*args, **kwargs)
        opened.append(ws)
        return ws

    monkeypatch.setattr(Workspace, "open", tracking)
    yield
    for ws in opened:
        ws.close()


def scores(values: list[float]) -> dict[str, list[float]]:
    return {t: [v] for t, v in zip(IDS, values, strict=False)}


# the exact test -----------------------------------------------------------------------------------------------------
def test_exact_sign_test_p_values_on_known_inputs() -> None:
    assert exact_sign_test(5, 0) == pytest.approx(1 / 32)
    assert exact_sign_test(7, 1) == pytest.approx(9 / 256)
    assert exact_sign_test(8, 2) == pytest.approx(56 / 1024)  # C(10,8) + C(10,9) + C(10,10) over 2^10
    assert exact_sign_test(0, 3) == 1.0 and exact_sign_test(0, 0) == 1.0
    # one look over tasks with 0/1 outcomes is the sign test on the discordant pairs (ties carry no information)
    (look,) = run_looks([[1] * 8 + [-1] * 2 + [0] * 6], 16, 0.05)
    assert look.p_value == pytest.approx(56 / 1024) and not look.accepted  # 0.0547 > 0.05
    (look,) = run_looks([[1] * 7 + [-1] + [0] * 8], 16, 0.05)
    assert look.p_value == pytest.approx(9 / 256) and look.accepted and look.boundary == 6  # 7 - 1 >= 6
    # with trials the magnitudes count: differences +1 and +1/2 (grid 2) flip to {3, 1, -1, -3}: P(S >= 3) = 1/4
    (look,) = run_looks([[2, 1]], 2, 0.5)
    assert look.p_value == pytest.approx(0.25)
    assert spending(0.05, 1.0) == 0.05 and 0 < spending(0.05, 0.25) < spending(0.05, 0.5) < 0.05


def test_the_sequential_rule_decides_by_name_and_as_the_configured_rule() -> None:
    cur, better = scores([0.0] * 8), scores([1.0] * 6 + [0.0] * 2)
    assert decide("sequential", cur, better).accepted  # 6 wins, 0 losses: p = 1/64
    assert not decide("sequential", cur, scores([1.0] * 4 + [0.0] * 4)).accepted  # 4 wins: p = 1/16
    cfg = load_config(None, ["train.acceptance=sequential", "train.alpha=0.01", "train.futility=0"])
    rule = make_rule(cfg.train)
    assert isinstance(rule, SequentialRule) and rule.alpha == 0.01 and rule.futility == 0
    assert make_rule(load_config(None, ["train.acceptance=strict"]).train) == ClassicRule("strict", 0.05)


# sequential: early accept, early reject ----------------------------------------------------------------------------
def test_sequential_accepts_early_once_the_evidence_crosses_its_boundary() -> None:
    current = scores([0.0] * 32)
    candidate = scores(([1.0] * 5 + [0.0] * 3) * 4)
    decision, episodes = validate_in_batches(SequentialRule(0.05), current, candidate, IDS[:32], batch=8)
    # look 1 (5 wins of 8): p = 1/32 > alpha(1/4) = 0.05 ln(1 + (e - 1)/4) = 0.018; look 2 (10 of 16): 1/1024
    assert spending(0.05, 0.25) == pytest.approx(0.0179, abs=1e-4)
    assert decision.accepted and decision.early and episodes == 16
    ev = decision.evidence
    assert ev is not None and ev.kind == "sequential test" and ev.looks == "2/4" and ev.tasks == 16
    assert ev.p_value is not None and ev.threshold is not None and ev.p_value <= ev.threshold <= 0.05
    assert "accepted early" in decision.reason
    # the same candidate on one look (no early stopping) spends every episode
    fixed, spent = validate_in_batches(SequentialRule(0.05), current, candidate, IDS[:32], batch=None)
    assert fixed.accepted and not fixed.early and spent == 32


def test_sequential_rejects_early_when_acceptance_is_out_of_reach_or_futile() -> None:
    current = scores([1.0] * 8)
    losing = scores([0.0] * 8)
    decision, episodes = validate_in_batches(SequentialRule(0.05, futility=0.0), current, losing, IDS[:8], batch=4)
    assert not decision.accepted and decision.taken and decision.early and episodes == 4
    assert "out of reach" in decision.reason  # 4 losses: even 4 wins after them cannot cross
    # futility: 6 losses in the first 8 of 32 tasks leave almost no chance at the design effect +0.1
    current, candidate = scores([1.0] * 6 + [0.0] * 26), scores([0.0] * 32)
    decision, episodes = validate_in_batches(SequentialRule(0.05, 0.1, 0.1), current, candidate, IDS[:32], batch=8)
    assert not decision.accepted and "futility" in decision.reason and episodes == 8
    # without futility stopping the same evidence runs until acceptance is out of reach
    decision, episodes = validate_in_batches(SequentialRule(0.05, 0.1, 0.0), current, candidate, IDS[:32], batch=8)
    assert not decision.accepted and episodes > 8


def test_sequential_rejects_when_the_pool_is_exhausted_and_shows_the_probability() -> None:
    current, candidate = scores([0.0] * 16), scores([1.0] * 3 + [0.0] * 13)
    decision, episodes = validate_in_batches(SequentialRule(0.05, futility=0.0), current, candidate, IDS[:16], 8)
    assert not decision.accepted and decision.taken and not decision.early and episodes == 16
    assert re.search(r"p=0\.125\b", decision.reason) and "no significant gain" in decision.reason
    # an incomplete candidate evaluation (budget, infrastructure) is not decided, with p so far
    cut = decision_of_partial = SequentialRule(0.05).start(current, IDS[:16], "val", 8).conclude(
        {t: v for t, v in candidate.items() if t in IDS[:12]})
    assert not cut.taken and not cut.accepted and "p=" in decision_of_partial.reason
    assert "candidate harness lacks 4/16 val task(s)" in cut.reason


# the false-accept rate ------------------------------------------------------------------------------------------------
def null_candidates(rng: random.Random, n: int, trials: int) -> tuple[dict, dict]:
    """A candidate with no effect: deterministic churn (trials 1: a third of the tasks flip, half each way), or
    stochastic episodes of the same per-task pass rates (trials > 1)."""
    current, candidate = {}, {}
    for t in IDS[:n]:
        if trials == 1:
            c = float(rng.random() < 0.45)
            flip = rng.random() < 0.3
            current[t], candidate[t] = [c], [1.0 - c if flip else c]
        else:
            p = rng.random()
            current[t] = [float(rng.random() < p) for _ in range(trials)]
            candidate[t] = [float(rng.random() < p) for _ in range(trials)]
    return current, candidate


@pytest.mark.parametrize("trials", [1, 3])
def test_the_false_accept_rate_is_bounded_on_a_seeded_simulation(trials: int) -> None:
    rng, reps, n = random.Random(7), 400, 32
    rule, strict = SequentialRule(0.05), ClassicRule("strict")
    sequential_accepts = strict_accepts = 0
    for _ in range(reps):
        current, candidate = null_candidates(rng, n, trials)
        sequential_accepts += validate_in_batches(rule, current, candidate, IDS[:n], 8, trials=trials)[0].accepted
        strict_accepts += validate_in_batches(strict, current, candidate, IDS[:n], 8, trials=trials)[0].accepted
    assert sequential_accepts / reps <= 0.05 + 2 * (0.05 * 0.95 / reps) ** 0.5  # alpha plus two standard errors
    assert strict_accepts / reps > 0.25  # the old default accepts noise


# the exact-evidence path (H2 repairs) -------------------------------------------------------------------------------
def test_exact_evidence_accepts_train_gains_without_val_loss_and_rejects_any_loss() -> None:
    train = SplitReplay("train", 24, 24, gained=["a", "b", "c"], lost=[], unknown=[])
    quiet_val = SplitReplay("val", 12, 12, gained=[], lost=[], unknown=[])
    d = decide_exact("sequential", train, quiet_val, 0.167, 0.05)
    assert d is not None and d.accepted and d.evidence is not None and d.evidence.kind == "exact replay"
    assert (d.evidence.train_gained, d.evidence.train_lost, d.evidence.val_lost) == (3, 0, 0)
    assert d.candidate == pytest.approx(0.167) and "no agent episode" in d.reason
    lossy_val = SplitReplay("val", 12, 12, gained=["v1"], lost=["v2"], unknown=[])
    d = decide_exact("sequential", train, lossy_val, 0.167)
    assert d is not None and not d.accepted and "loses 1 task" in d.reason
    lossy_train = SplitReplay("train", 24, 24, gained=["a"], lost=["b"], unknown=[])
    assert not decide_exact("sequential", lossy_train, quiet_val, 0.1).accepted
    nothing = SplitReplay("train", 24, 24, gained=[], lost=[], unknown=[])
    assert not decide_exact("sequential", nothing, quiet_val, 0.1).accepted
    unknown = SplitReplay("val", 12, 12, gained=[], lost=[], unknown=["v3"])  # replay could not grade v3
    assert decide_exact("sequential", train, unknown, 0.1) is None


def h2_rows() -> list[dict]:
    rows = [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "split": "train"}
            for i in range(6)]
    rows += [{"id": f"v{i}", "prompt": f"Add {100 + i} and {i}.", "answer": str(100 + 2 * i), "split": "val"}
             for i in range(4)]
    return rows + [{"id": "x0", "prompt": "Add 1 and 1.", "answer": "2", "split": "test"}]


def right_on_train_wrong_on_val(messages: list[Message]) -> str:
    a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
    return f"The result is \\boxed{{{a + b + (1 if a >= 100 else 0)}}}"


def val_right_only_after_feedback(messages: list[Message]) -> str:
    """Train: a boxed right answer (the seed rejects it twice). Val: a boxed wrong answer first, then after the
    seed's feedback the `Answer:` line, right: the seed passes val, the repair would take the wrong boxed one."""
    first = next(m.content for m in messages if m.role == "user")
    a, b = map(int, re.findall(r"\d+", first)[:2])
    if a < 100:
        return f"The result is \\boxed{{{a + b}}}"
    asked_again = any("Answer: <number>" in m.content for m in messages[1:] if m.role == "user")
    return f"Answer: {a + b}" if asked_again else "So \\boxed{999}"


async def test_an_h2_repair_is_decided_on_its_exact_replays_without_val_episodes(tmp_path: Path) -> None:
    """The `boxed_answer` repair gains every training task on the stored replies and changes no val outcome (the
    val answers are wrong either way): the sequential rule accepts it on that exact evidence, running no val
    episode of the candidate; strict rejects the same candidate for lack of a val gain."""
    ws = make_ws(tmp_path, Roles(), ScriptedModel(right_on_train_wrong_on_val, name="agent"), "train.rounds=1",
                 'train.accept_on="val"', "train.acceptance=sequential", rows=h2_rows())
    result = await train_async(ws.config, "aggregate", ws=ws)
    first = result.rounds[0]
    assert first.accepted and first.evidence is not None and first.evidence.kind == "exact replay"
    assert (first.evidence.train_gained, first.evidence.train_lost, first.evidence.val_lost) == (6, 0, 0)
    assert first.evidence.current == first.harness_before and first.evidence.candidate == first.harness_after
    assert ws.store.get_record(result.run_id, "timing", "r1/exact") is not None
    # decided before any candidate episode ran; accepted, it is evaluated on val as the next base: every reply
    # comes from the response cache (same prompts), so it costs no agent execution
    assert result.agent_executions == 6 + 4 and result.cached_executions == 4
    assert result.curve[-1].val_score == 0.0 and first.candidate_score == 0.0
    assert records.load(ws.store, result.run_id, RoundRecord, "r1").evidence == first.evidence
    assert "cannot be told from noise" in (result.accept_rule.warning or "")  # 4 val tasks


async def test_an_h2_repair_that_loses_a_val_task_on_the_stored_replies_is_rejected(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(val_right_only_after_feedback, name="agent"), "train.rounds=1",
                 'train.accept_on="val"', "train.acceptance=sequential", rows=h2_rows())
    manifest = tmp_path / "seed" / "harness.toml"  # one more turn after a rejection, with its feedback
    manifest.write_text(manifest.read_text().replace("max_rejections = 0", "max_rejections = 1"))
    result = await train_async(ws.config, "aggregate", ws=ws)
    first = result.rounds[0]
    assert result.val_before == 1.0  # the seed passes val after its feedback
    assert not first.accepted and first.evidence is not None and first.evidence.kind == "exact replay"
    assert first.evidence.train_gained == 6 and first.evidence.val_lost == 4 and "loses 4 task" in first.reason


# the decision record, shown ------------------------------------------------------------------------------------------
RULE_TEXT = "End with a line Answer: N."
RULE_SPEC = {"patterns_addressed": ["P1"], "skills": [], "implementation_notes": "", "expected_effect": "",
             "changes": [{"layer": "H3", "kind": "add_rule", "file": "", "text": RULE_TEXT, "repair": "", "value": 0,
                          "rationale": "format"}]}


def answers_when_told(messages: list[Message]) -> str:
    """Right (`Answer: N`) when the rule is in the prompt; otherwise a reply no repair can parse."""
    if any(RULE_TEXT in m.content for m in messages):
        a, b = map(int, re.findall(r"\d+", messages[-1].content)[:2])
        return f"Answer: {a + b}"
    return "I am not sure."


def rule_ws(tmp_path: Path, n_val: int = 16, extra: tuple[str, ...] = ()) -> Workspace:
    """`n_val` "Add" tasks in val (6 in train, 2 in test), roles that always propose the rule, an agent that
    `answers_when_told`; `extra` config overrides."""
    rows = [{"id": f"{s}{k:02d}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "split": split}
            for s, split, base, n in (("t", "train", 0, 6), ("v", "val", 10, n_val), ("x", "test", 40, 2))
            for k, i in enumerate(range(base, base + n))]
    cfg = load_config(None, [*jsonl_project(tmp_path, rows), 'agent.model="scripted:agent"', "train.rounds=1",
                             f'run.run_dir="{tmp_path / "run"}"', f'cache.path="{tmp_path / "c.sqlite"}"',
                             "train.acceptance=sequential", "train.engine.eval_batch=4", 'train.accept_on="val"',
                             "train.engine.skip_debate_when_verified=false", *extra])
    ws = Workspace.open(cfg)
    ws.backends["agent|scripted:agent"] = ScriptedModel(answers_when_told, name="agent")
    for role in ROLES:
        ws.backends[f"{role}|scripted:agent"] = ScriptedModel(Roles(spec=RULE_SPEC), name="roles")
    return ws


async def test_a_prompt_edit_is_accepted_early_by_the_test_and_the_record_says_why(tmp_path: Path) -> None:
    ws = rule_ws(tmp_path)
    result = await train_async(ws.config, "aggregate", ws=ws)
    first = result.rounds[0]
    ev = first.evidence
    assert first.accepted and first.early_stopped and ev is not None
    assert (ev.kind, ev.rule, ev.split, ev.alpha, ev.looks) == ("sequential test", "sequential", "val", 0.05, "2/4")
    assert (ev.tasks, ev.pool, ev.wins, ev.losses, ev.episodes) == (8, 16, 8, 0, 8)
    assert ev.effect == 1.0 and ev.p_value == pytest.approx(1 / 256) and ev.p_value <= ev.threshold
    assert ev.current == first.harness_before and ev.candidate == first.candidate
    assert ev.stopped.startswith("accepted early")
    assert result.agent_executions == 6 + 16 + 8  # seed train and val, half the pool for the candidate
    out = io.StringIO()
    from ecdysis.cli.views import train_summary, training_overview

    train_summary(Console(file=out, width=300), result)
    training_overview(Console(file=out, width=300), load_run(ws.store, result.run_id))
    text = out.getvalue()
    assert "sequential test (sequential) on val: 8/16 tasks" in text and "Decisions" in text
    assert "false-accept rate 0.05" in text
    from ecdysis.report.html import write_report

    html = write_report(ws.store, result.run_id, tmp_path / "report.html").read_text()
    assert "<b>Evidence:</b> sequential test (sequential) on val: 8/16 tasks" in html


def test_noise_floor_and_pass_hat_k_are_recorded_with_trials() -> None:
    current = {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, 0.0]}
    candidate = {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [1.0, 0.0]}
    d = SequentialRule().start(current, ["a", "b", "c"], "val", None, trials=2).conclude(candidate)
    ev = d.evidence
    assert ev is not None and ev.trials == 2 and ev.noise == pytest.approx(1 / 3)  # task a disagrees with itself
    assert ev.pass_hat_k == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert (ev.wins, ev.losses, ev.ties) == (2, 0, 1) and "pass^2 0.33 -> 0.67" in ev.summary()


# splits sized from the data -------------------------------------------------------------------------------------------
def test_split_sizes_are_proposed_and_small_splits_warned() -> None:
    # every task won (effect +1, no background): the exact test needs 5 discordant pairs at alpha 0.05
    assert power(4, 1.0, 0.05, background=0.0) == 0.0 and power(5, 1.0, 0.05, background=0.0) == 1.0
    small = advise(10, 40, 0.1, 0.05, "strict")
    assert small.warning is not None and small.detectable is not None and small.detectable > 0.5
    assert "one-task change (+0.100)" in small.warning and "under `strict`" in small.warning
    assert small.proposed is not None and f"about {small.proposed} val tasks" in small.warning
    assert "more than half of your 40" in small.warning
    assert small.proposed > 100 and power(small.proposed, 0.1, 0.05) >= 0.8 > power(small.proposed - 8, 0.1, 0.05)
    large = advise(200, 1000, 0.1, 0.05)
    assert large.warning is None and large.detectable is not None and large.detectable <= 0.1


def test_init_proposes_a_val_size_for_a_task_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ecdysis.cli.main import app

    rows = [{"id": f"q{i}", "prompt": f"Add {i} and 1.", "answer": str(i + 1)} for i in range(30)]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = CliRunner().invoke(app, ["init", str(tmp_path / "p"), "--env", "jsonl", "--tasks", str(tmp_path / "t.jsonl")],
                             env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    assert "proposed val size for train.min_effect = 0.1: 134 task(s)" in out.output
    assert "cannot be told from noise" in out.output


# the final-selection check ----------------------------------------------------------------------------------------
def holdout_ws(tmp_path: Path, rule_hurts_holdout: bool) -> tuple[Workspace, set[str]]:
    """16 val tasks decide (val_limit), 8 more are the held-out slice. The rule makes the agent right on the
    acceptance tasks; on the held-out ones it is right without the rule and, if `rule_hurts_holdout`, wrong with it."""
    ws = rule_ws(tmp_path, n_val=24, extra=("train.val_limit=16",))
    held = {t.prompt for t in ws.tasks("val", None)[16:]}

    def agent(messages: list[Message]) -> str:
        question = next(m.content for m in messages if m.role == "user" and m.content.startswith("Add"))
        told = any(RULE_TEXT in m.content for m in messages)
        if question.strip() in held:
            a, b = map(int, re.findall(r"\d+", question)[:2])
            return "I am not sure." if told and rule_hurts_holdout else f"Answer: {a + b}"
        return answers_when_told(messages)

    ws.backends["agent|scripted:agent"] = ScriptedModel(agent, name="agent")
    return ws, held


async def test_a_harness_worse_on_fresh_val_tasks_is_not_frozen(tmp_path: Path) -> None:
    """Accepted on the 16 acceptance tasks, the rule loses all 8 held-out tasks: the final-selection check shows a
    loss at alpha and the seed is frozen; the record and the summary say so."""
    ws, held = holdout_ws(tmp_path, rule_hurts_holdout=True)
    assert len(held) == 8
    result = await train_async(ws.config, "aggregate", ws=ws)
    assert result.rounds[0].accepted
    check = result.holdout
    assert check is not None and (check.tasks, check.wins, check.losses) == (8, 0, 8)
    assert (check.seed_score, check.final_score) == (1.0, 0.0)
    assert check.p_worse == pytest.approx(1 / 256) and check.kept == "seed"
    assert result.final_harness_id == result.seed_harness_id  # the seed was frozen
    assert result.test_after == {**result.test_after, "accuracy": result.test_before["accuracy"]}
    stored = ws.store.get_record(result.run_id, "holdout", "check")
    assert stored["kept"] == "seed" and load_run(ws.store, result.run_id).holdout == check
    out = io.StringIO()
    from ecdysis.cli.views import train_summary

    train_summary(Console(file=out, width=300), result)
    assert "final-selection check on 8 held-out val task(s): seed 1.000 -> trained 0.000" in out.getvalue()
    assert "the seed is frozen" in out.getvalue()


async def test_a_harness_that_holds_on_fresh_val_tasks_is_frozen(tmp_path: Path) -> None:
    ws, _ = holdout_ws(tmp_path, rule_hurts_holdout=False)
    result = await train_async(ws.config, "aggregate", ws=ws)
    check = result.holdout
    assert result.rounds[0].accepted and check is not None
    assert (check.tasks, check.wins, check.losses, check.kept) == (8, 0, 0, "final")
    assert result.final_harness_id == result.rounds[0].harness_after != result.seed_harness_id


def test_the_held_out_slice_is_sized_from_what_is_left() -> None:
    from ecdysis.config import TrainSection
    from ecdysis.trainer.holdout import holdout_size

    assert holdout_size(TrainSection(val_limit=16), 7) == 0  # "auto": fewer than 8 left, no check
    assert holdout_size(TrainSection(val_limit=16), 30) == 16  # "auto": as many as decide
    assert holdout_size(TrainSection(val_limit=6), 30) == 0  # ... and never fewer than 8
    assert holdout_size(TrainSection(val_limit=6, holdout_limit=4), 30) == 4
    assert holdout_size(TrainSection(val_limit=6, holdout_limit=40), 30) == 30
    assert holdout_size(TrainSection(holdout_limit=0), 30) == 0


def test_exact_training_gains_are_settled_by_val_runs_without_a_loss() -> None:
    """An H2 change whose training replay is exact (+3 -0) but whose val replays are not: val agent runs settle it.
    +2 -0 on 12 val tasks is accepted (the sign test alone could not: p = 0.25); any loss rejects, and the early
    stop names the first lost task."""
    from ecdysis.trainer.exact import ReplayEvidence, decide_train_exact, first_loss

    train = SplitReplay("train", 24, 24, gained=["a", "b", "c"], lost=[], unknown=[])
    assert ReplayEvidence(None, train).exact_train_gain()
    assert not ReplayEvidence(None, SplitReplay("train", 24, 24, ["a"], [], ["b"])).exact_train_gain()  # inexact
    assert not ReplayEvidence(None, SplitReplay("train", 24, 24, ["a"], ["b"], [])).exact_train_gain()  # a loss
    ids = [f"v{i}" for i in range(12)]
    current = {t: [1.0 if i < 6 else 0.0] for i, t in enumerate(ids)}
    better = {t: [1.0 if i < 8 else 0.0] for i, t in enumerate(ids)}
    d = decide_train_exact("sequential", train, current, better, ids, "val", 0.05)
    assert d.accepted and d.evidence is not None and d.evidence.kind == "exact train + val runs"
    assert (d.evidence.wins, d.evidence.losses, d.evidence.ties, d.evidence.train_gained) == (2, 0, 10, 3)
    assert exact_sign_test(2, 0) == 0.25  # what the test on agent runs alone would have had to decide on
    assert "exact replay on stored training replies: train +3 -0; val in agent runs: 12/12" in d.evidence.summary()
    worse = {**better, "v0": [0.0]}
    d = decide_train_exact("sequential", train, current, worse, ids, "val", 0.05)
    assert not d.accepted and "loses 1 val task" in d.reason
    assert first_loss(current)({"v0": [0.0], "v7": [1.0]}) == "loses val task v0"
    assert first_loss(current)({"v7": [1.0]}) is None
    partial = {t: better[t] for t in ids[:6]}
    assert not decide_train_exact("sequential", train, current, partial, ids, "val").accepted  # val did not run out
