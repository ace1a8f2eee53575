"""Reports rendered from stored runs (scripted models): numbers match the store, every round, diff,
lineage and evidence trajectories are present; `show` and `diff` print the same facts."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import Roles, add_answer, make_ws

from ecdysis.compare.run import compare
from ecdysis.models import Message, ScriptedModel
from ecdysis.report.data import EvalRow, RunView, compare_curves, load_run, summary_card, trajectory_anchor
from ecdysis.report.html import render_report
from ecdysis.store import RunStore
from ecdysis.trainer import train_async


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})  # not a terminal's 80 leaked by readline


def hostile_adder(messages: list[Message]) -> str:
    return "<script>alert(1)</script> " + add_answer(messages)


async def test_report_shows_every_round_with_numbers_from_the_store(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(hostile_adder, name="adder"))
    result = await train_async(ws.config, "ecdysis", ws=ws)  # rounds and their patterns
    text = render_report(ws.store, result.run_id[:14])  # a unique prefix is enough
    assert len(result.rounds) == 2
    for r in result.rounds:
        assert f'id="round-{r.round}"' in text
    card = dict(re.findall(r"<span>([^<]+)</span><b>([^<]+)</b>", text))
    test_before, test_after = result.test_before["accuracy"], result.test_after["accuracy"]
    assert html.unescape(card["test accuracy seed → final"]) == f"{test_before:.3f} → {test_after:.3f}"
    assert html.unescape(card["train accuracy"]) == f"{result.train_before:.3f} → {result.train_after:.3f}"
    assert card["agent executions"] == str(result.agent_executions)
    assert card["rounds"] == "2 (1 accepted)"
    outcomes = load_run(ws.store, result.run_id).step_outcomes  # what its charged time bought, step by step
    assert outcomes["accepted"][1] == 1 and sum(n for _, n in outcomes.values()) == len(result.curve) - 1
    assert card["steps by outcome (charged s)"].startswith(f"1 accepted ({outcomes['accepted'][0]:.0f} s)")
    assert '<div class="add">+[&#34;boxed_answer&#34;]</div>' in text  # round 1's diff: the repair it enabled
    assert f'id="version-{result.final_harness_id}"' in text and 'class="badge final"' in text
    assert text.count("<svg") == 4
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)" in text  # model text is escaped, not run
    assert not re.search(r"""(src|href)=["']?(https?:|//)|<link|@import""", text)  # self-contained: nothing fetched
    view = load_run(ws.store, result.run_id)
    evidence = [e["task_id"] for p in view.rounds[0].patterns for e in p.data["evidence"]]
    assert evidence and all(f'id="{trajectory_anchor(1, task)}"' in text for task in evidence)
    assert view.rounds[0].patterns[0].fixed_next == view.rounds[0].patterns[0].support  # all fixed by round 2
    accuracies = [e.accuracy for e in view.evaluations if e.label == "test"]
    assert sorted(accuracies) == sorted([test_before, test_after])


async def test_compare_report_plots_every_arm_and_lists_their_results(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=2")
    results = await compare(ws.config, ["fixed", "serial", "ecdysis"], open_workspace=lambda cfg: ws)
    store = RunStore(ws.config.run.run_dir)
    ecdysis_run = next(r["id"] for r in store.runs() if r["id"].startswith("train-ecdysis"))
    text = render_report(store, ecdysis_run)
    table = text[text.index('<table id="compare"'):]
    table = table[:table.index("</table>")]
    assert all(f'<th class="num">{r.arm} s0</th>' in table for r in results)  # one column per arm and seed
    speed = text[text.index('id="plot-speed"'):]
    assert "serial train" in speed[:speed.index("</svg>")] and "ecdysis train" in speed[:speed.index("</svg>")]
    curves = text[text.index('id="plot-curves"'):]  # the compare's curves: score vs charged time and executions
    curves = curves[:curves.index("</svg>")]
    assert "cumulative agent executions" in curves and "cumulative charged training time" in curves
    assert all(p.charged_s is not None for c in compare_curves(store) for p in c.points)
    assert "serial" in curves and "ecdysis" in curves and "fixed" not in curves  # fixed has no training curve
    assert [c.arm for c in compare_curves(store)] == ["serial", "ecdysis"]
    assert [p.step for p in compare_curves(store)[1].points] == [p.step for p in results[2].curve]


async def test_show_and_diff_print_rounds_and_the_harness_change(tmp_path: Path) -> None:
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"))
    result = await train_async(ws.config, "ecdysis", ws=ws)  # rounds and their patterns
    ws.close()
    run_dir = str(ws.config.run.run_dir)
    shown = cli("show", result.run_id, "--run-dir", run_dir, cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Rounds" in shown.stdout and "nothing recurring left" in shown.stdout
    assert result.final_harness_id in shown.stdout
    diff = cli("diff", result.run_id, "--run-dir", run_dir, cwd=tmp_path)
    assert diff.returncode == 0 and '+["boxed_answer"]' in diff.stdout
    assert f"{result.seed_harness_id} -> {result.final_harness_id}" in diff.stdout
    missing = cli("diff", result.run_id, "seed", "ffff", "--run-dir", run_dir, cwd=tmp_path)
    assert missing.returncode == 2 and "no harness version matches 'ffff'" in missing.stderr
    out = tmp_path / "r.html"
    made = cli("report", result.run_id, "--run-dir", run_dir, "-o", str(out), cwd=tmp_path)
    assert made.returncode == 0 and out.stat().st_size > 10_000
    unknown = cli("report", "train-nope", "--run-dir", run_dir, cwd=tmp_path)
    assert unknown.returncode == 2 and "no run 'train-nope'" in unknown.stderr


def test_report_of_an_eval_run_without_evaluations_says_so(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    run_id = store.start_run("eval", {"env": {"name": "jsonl"}})
    text = render_report(store, run_id)  # an evaluation report (tests/test_failures_visible.py has a full one)
    assert f"Evaluation report <code>{run_id}</code>" in text and "this run has no evaluations" in text


def test_a_split_validated_in_batches_counts_every_task_it_scored() -> None:
    def row(eval_id: str, split: str, tasks: list[str]) -> EvalRow:
        return EvalRow(id=eval_id, label=split, split=split, harness_id="h", n_tasks=len(tasks), trials=1,
                       episodes=len(tasks), accuracy=0.0, tokens=0, wall_s=0.0, terminations={},
                       passed=frozenset(), scores=dict.fromkeys(tasks, 0.0))

    view = RunView(run_id="r", kind="train", status="finished", config={}, summary={})
    view.evaluations = [row("e1", "train", ["t1", "t2", "t3"]), row("e2", "val", ["v1", "v2"]),
                        row("e3", "val", ["v3", "v4"]),  # the same validation's second batch
                        row("e4", "val", ["v1", "v2"])]  # a candidate's first batch: the same tasks again
    assert view.split_sizes() == {"train": 3, "val": 4}
    assert dict(summary_card(view))["splits (tasks)"] == "train 3 / val 4"
