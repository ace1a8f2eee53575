"""Terminal views (rich tables) of models, runs and evaluations. Views only read the store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..models.local_models import LocalModelSpec
from ..runner.failures import FailureCounts, merge_counts
from ..runner.runner import EvalSummary
from ..store import RunStore
from .failure_views import failure_table


def key_column(table: Table, name: str, values: list[str]) -> None:
    """A column that is never truncated or wrapped: names, references and ids are what users copy."""
    table.add_column(name, no_wrap=True, min_width=max([len(name), *map(len, values)]))


def models_table(console: Console, models: list[tuple[LocalModelSpec, bool]], where: Path) -> None:
    wide = console.width >= 110  # narrow terminals keep the columns users copy and drop the description
    table = Table(title=f"Local models ({where})")
    key_column(table, "name", [spec.name for spec, _ in models])
    if wide:
        table.add_column("description")
    table.add_column("size", no_wrap=True)
    table.add_column("present")
    key_column(table, "reference", [f"local:{spec.name}" for spec, _ in models])
    for spec, present in models:
        cells = [spec.name, *([spec.description] if wide else []), f"{spec.size_mb} MB", "yes" if present else "no",
                 f"local:{spec.name}"]
        table.add_row(*cells)
    console.print(table)


def eval_summary(console: Console, s: EvalSummary, run_id: str, run_dir: Path) -> None:
    table = Table(title=f"Evaluation {s.eval_id} (run {run_id})", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    table.add_row("split / tasks / trials", f"{s.split} / {s.n_tasks} / {s.trials}")
    table.add_row("accuracy", f"{s.accuracy:.3f}")
    if s.trials > 1:
        table.add_row(f"pass@{s.trials} / pass^{s.trials}", f"{s.pass_at_k:.3f} / {s.pass_hat_k:.3f}")
    table.add_row("terminations", ", ".join(f"{k}={v}" for k, v in sorted(s.terminations.items())))
    table.add_row("tokens (prompt + completion)", f"{s.prompt_tokens} + {s.completion_tokens}")
    table.add_row("model calls (cache hits)", f"{s.model_calls} ({s.cache_hits})")
    table.add_row("prompt tokens from the backend's prefix cache", prefix_cache_text(s.prompt_tokens,
                                                                                   s.cached_prompt_tokens))
    if s.model_retries or s.infra_failures:
        table.add_row("model retries / episodes lost to infrastructure", f"{s.model_retries} / {s.infra_failures}")
    table.add_row("wall time (this invocation)", f"{s.wall_s:.1f}s")
    table.add_row("model time (all episodes)", f"{s.model_time_s:.1f}s")
    console.print(table)
    failure_table(console, s.failures, show=f"ecdysis show {run_id} --run-dir {run_dir}")
    console.print(f"[dim]stored in {run_dir}; `ecdysis show {run_id} --run-dir {run_dir}`[/]")


def prefix_cache_text(prompt_tokens: int, cached: int) -> str:
    """'cached of sent (hit rate); processed' for a summary row."""
    rate = cached / prompt_tokens if prompt_tokens else 0.0
    return f"{cached} of {prompt_tokens} ({rate:.0%}); processed {prompt_tokens - cached}"


def train_summary(console: Console, r: Any) -> None:
    table = Table(title=f"Training run {r.run_id} ({r.arm})", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    for rec in r.rounds:
        verdict = "accepted" if rec.accepted else "rejected"
        table.add_row(f"round {rec.round}", f"train {rec.train_score:.3f}; {rec.recurring} recurring; "
                      f"{verdict}: {rec.reason or ''}")
    table.add_row("stop", r.stop_reason)
    table.add_row("harness", f"{r.seed_harness_id[:8]} -> {r.final_harness_id[:8]} (frozen in {r.frozen_dir})")
    if (rule := r.accept_rule) is not None:
        table.add_row("edits decided on", f"{rule.accept_on} ({rule.tasks} tasks, {rule.rule}): {rule.why}")
    table.add_row("train accuracy", f"{_fmt(r.train_before)} -> {_fmt(r.train_after)}")  # None: not evaluated
    if r.val_before is not None:
        table.add_row("val accuracy", f"{r.val_before:.3f} -> {r.val_after:.3f}")
    if r.test_before:
        table.add_row("test accuracy (seed)", f"{r.test_before['accuracy']:.3f} on {r.test_before['n_tasks']} tasks")
    if r.test_after:
        table.add_row("test accuracy (final)", f"{r.test_after['accuracy']:.3f} on {r.test_after['n_tasks']} tasks")
    table.add_row("training wall time", f"{r.wall_s:.1f}s")
    table.add_row("agent executions (train)", f"{r.agent_executions} run, {r.cached_executions} cache-served")
    table.add_row("optimizer calls / tokens", f"{r.optimizer_calls} / {r.optimizer_tokens}")
    table.add_row("agent tokens (all)", str(r.agent_tokens))
    for role, (sent, cached) in sorted(r.prompt_cache.items()):
        table.add_row(f"{role} prompt tokens from prefix cache", prefix_cache_text(sent, cached))
    console.print(table)


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def compare_table(console: Console, results: list[Any]) -> None:
    """One column per arm and seed, one row per measure (fits a terminal with six arms)."""
    table = Table(title="Arms compared (same tasks, models, cache)")
    table.add_column("measure")
    for r in results:
        table.add_column(r.arm + (f" k={r.k}" if r.arm == "best-of-k" else "") + f" s{r.seed}", justify="right")
    rows: list[tuple[str, Any]] = [
        ("train wall s", lambda r: f"{r.train_wall_s:.0f}"), ("agent executions", lambda r: str(r.agent_executions)),
        ("optimizer calls", lambda r: str(r.optimizer_calls)), ("optimizer tokens", lambda r: str(r.optimizer_tokens)),
        ("agent tokens", lambda r: str(r.agent_tokens)),
        ("edits accepted/rejected", lambda r: f"{r.accepted_edits}/{r.rejected_edits}"),
        ("train acc", lambda r: _fmt(r.train_acc)), ("val acc", lambda r: _fmt(r.val_acc)),
        ("test acc", lambda r: _fmt(r.test_acc)),
        ("pass@k", lambda r: _fmt(r.pass_at_k)), ("pass^k", lambda r: _fmt(r.pass_hat_k)),
        ("gap (train - test)", lambda r: _fmt(r.gap)),
        ("speed-up vs serial", lambda r: _fmt(r.speedup_vs_serial, ".2f")),
        ("executions ratio vs serial", lambda r: _fmt(r.executions_ratio_vs_serial, ".2f")),
        ("s to serial's final acc", lambda r: _fmt(r.time_to_serial_acc_s, ".0f")),
        ("speed-up to serial's acc", lambda r: _fmt(r.speedup_to_serial_acc, ".2f")),
        ("  the same, after the seed eval", lambda r: _fmt(r.speedup_to_serial_acc_after_seed, ".2f")),
        ("test gain vs fixed", lambda r: _fmt(r.test_gain_vs_fixed, "+.1%")),
        ("test acc - fixed", lambda r: _fmt(r.test_delta_vs_fixed, "+.3f")),
        ("test gain vs serial", lambda r: _fmt(r.test_gain_vs_serial, "+.1%")),
        ("transfer acc", lambda r: _fmt(r.transfer_acc)),
        ("prompt tokens from prefix cache", lambda r: _fmt(r.prefix_cache_rate, ".0%")),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(r) for r in results))
    console.print(table)


def runs_table(console: Console, store: RunStore) -> None:
    table = Table(title=f"Runs in {store.run_dir}")
    key_column(table, "id", [run["id"] for run in store.runs()])
    for col in ("kind", "status", "created", "evaluations"):
        table.add_column(col)
    for run in store.runs():
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created"]))
        table.add_row(run["id"], run["kind"], run["status"], created, str(len(store.evaluations(run["id"]))))
    console.print(table)


def run_evaluations(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """Each evaluation of a run with its progress, accuracy, terminations and tokens (for tables and --json)."""
    from ..report.data import evaluation_rows

    return [row.to_dict() for row in evaluation_rows(store, run_id)]


def decoded(run: dict[str, Any]) -> dict[str, Any]:
    """A run row with its JSON columns (config, summary) as objects."""
    return {k: (json.loads(v) if k in ("config", "summary") and isinstance(v, str) and v else v)
            for k, v in run.items()}


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (plain print: no wrapping, no markup)."""
    print(json.dumps(data, indent=1, default=str))


def run_detail(console: Console, store: RunStore, run: dict[str, Any],
               evaluations: list[dict[str, Any]] | None = None) -> None:
    """Evaluations (`run_evaluations` rows, read from the store unless given) and model calls by role."""
    console.print(f"[bold]{run['id']}[/] ({run['kind']}, {run['status']})")
    table = Table(title="Evaluations")
    evaluations = run_evaluations(store, run["id"]) if evaluations is None else evaluations
    key_column(table, "eval", [e["id"] for e in evaluations])
    for col in ("label", "harness", "split", "done/planned", "accuracy", "terminations", "failures", "tokens"):
        table.add_column(col)
    failures = [FailureCounts.from_dict(e.get("failures")) for e in evaluations]
    for e, failed in zip(evaluations, failures, strict=True):
        table.add_row(e["id"], e["label"], e["harness_id"][:8], e["split"], f"{e['done']}/{e['planned']}",
                      f"{e['accuracy']:.3f}", ", ".join(f"{k}={v}" for k, v in sorted(e["terminations"].items())),
                      failed.text() or "-", str(e["tokens"]))
    console.print(table)
    failure_table(console, merge_counts(failures), "Failures by kind over these evaluations (apart from wrong "
                  "answers)", show=f"ecdysis show {run['id']} --run-dir {store.run_dir}")
    calls = Table(title="Model calls by role")
    for col in ("role", "calls", "cache hits", "prompt tok", "prefix-cached tok", "completion tok", "model time",
                "cost $"):
        calls.add_column(col)
    for row in store.call_totals(run["id"]):
        calls.add_row(row["role"], str(row["calls"]), str(row["cache_hits"]), str(row["prompt_tokens"]),
                      str(row["cached_tokens"] or 0), str(row["completion_tokens"]), f"{row['model_time_s'] or 0:.1f}s",
                      f"{row['cost_usd'] or 0:.4f}")
    console.print(calls)


def training_overview(console: Console, run: Any) -> None:
    """The report's summary card, rounds and lineage of a training run (a `report.data.RunView`)."""
    from ..report.data import fmt, summary_card

    card = Table(title=f"Training run {run.run_id} ({run.arm}, {run.status})", show_header=False)
    card.add_column("metric")
    card.add_column("value")
    for label, value in summary_card(run):
        card.add_row(label, value)
    console.print(card)
    rounds = Table(title="Rounds")
    for col in ("round", "train", "patterns (recurring)", "candidate", "decision", "reason"):
        rounds.add_column(col)
    for r in run.rounds:
        rec = r.record
        verdict = "[green]accepted[/]" if rec.accepted else ("[yellow]stop[/]" if rec.stop else "[red]rejected[/]")
        candidate = (f"{rec.candidate[:8]} {fmt(rec.candidate_score)} on {rec.decided_on}" if rec.candidate
                     else "–")
        rounds.add_row(str(rec.round), fmt(rec.train_score), f"{len(r.patterns)} ({rec.recurring})", candidate,
                       verdict, rec.stop or rec.reason or "")
    console.print(rounds)
    lineage = Table(title="Harness lineage")
    key_column(lineage, "version", [n.id for n in run.lineage])
    for col in ("parent", "status", "note"):
        lineage.add_column(col)
    for n in run.lineage:
        lineage.add_row(n.id, (n.parent or "")[:8], n.status, n.note)
    console.print(lineage)
