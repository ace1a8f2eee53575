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
    from ..report.data import training_time_text  # not at import: it loads the trainer

    table = Table(title=f"Training run {r.run_id} ({r.arm})", show_header=False)
    table.add_column("metric")
    table.add_column("value")
    for rec in r.rounds:
        table.add_row(f"round {rec.round}", f"train {rec.train_score:.3f}; {rec.recurring} recurring; "
                      f"{round_verdict(rec)}: {rec.reason or ''}")
        for label, ev in decision_evidence(rec):
            table.add_row(f"  evidence{label}", ev.summary())
    table.add_row("stop", r.stop_reason)
    table.add_row("harness", f"{r.seed_harness_id[:8]} -> {r.final_harness_id[:8]} (frozen in {r.frozen_dir})")
    table.add_row("edits decided on", accept_rule_text(r.accept_rule))
    if getattr(r, "holdout", None) is not None:
        table.add_row("final-selection check", r.holdout.line())
    table.add_row("train accuracy", f"{_fmt(r.train_before)} -> {_fmt(r.train_after)}")  # None: not evaluated
    if r.val_before is not None:
        table.add_row("val accuracy", f"{r.val_before:.3f} -> {r.val_after:.3f}")
    if r.test_before:
        table.add_row("test accuracy (seed)", f"{r.test_before['accuracy']:.3f} on {r.test_before['n_tasks']} tasks")
    if r.test_after:
        table.add_row("test accuracy (final)", f"{r.test_after['accuracy']:.3f} on {r.test_after['n_tasks']} tasks")
    table.add_row("training time", training_time_text(r.charged_s, r.wall_s))
    table.add_row("agent episodes (training)", episodes_text(r.agent_executions, r.cached_executions))
    table.add_row("optimizer calls / tokens", f"{r.optimizer_calls} / {r.optimizer_tokens}")
    table.add_row("agent tokens (all)", str(r.agent_tokens))
    for role, (sent, cached) in sorted(r.prompt_cache.items()):
        table.add_row(f"{role} prompt tokens from prefix cache", prefix_cache_text(sent, cached))
    console.print(table)


VERDICT_STYLE = {"accepted": "green", "rejected": "red"}  # undecided, stop, no candidate: yellow


def round_verdict(rec: Any) -> str:
    """What a round (a `RoundRecord`) decided: accepted, rejected (a candidate was validated and lost), undecided
    (its evaluation was cut short), stop (it ended training before building a candidate) or no candidate."""
    if rec.accepted:
        return "accepted"
    if rec.attempts():
        return "rejected" if rec.decision_taken else "undecided"
    return "stop" if rec.stop else "no candidate"


def episodes_text(run: int, cached: int) -> str:
    """'12 run by the model + 6 served from the response cache (not counted in agent_executions) = 18', or
    '12 run by the model'."""
    if not cached:
        return f"{run} run by the model"
    return (f"{run} run by the model + {cached} served from the response cache (not counted in agent_executions) "
            f"= {run + cached}")


def decision_evidence(rec: Any) -> list[tuple[str, Any]]:
    """(label, DecisionEvidence) of a round record: its own decision, or each serial edit's."""
    out = [("", rec.evidence)] if rec.evidence is not None else []
    return out + [(f" ({e.task})", e.evidence) for e in rec.edits if e.evidence is not None]


def accept_rule_text(rule: Any) -> str:
    """The acceptance split and rule as recorded with the run (an `AcceptRule`), with what it can detect."""
    text = f"{rule.accept_on} ({rule.tasks} tasks, {rule.rule}"
    text += f", false-accept rate {rule.alpha:g}" if rule.alpha is not None else ""
    text += f", detects +{rule.detectable:.2f} or more" if rule.detectable is not None else ""
    text += f"): {rule.why}"
    return text + (f". Warning: {rule.warning}" if rule.warning else "")


def split_proposal(console: Console, counts: dict[str, int]) -> None:
    """`init`: what the task file's val split can detect under the default acceptance settings, the val size that
    detects `train.min_effect`, and the warning when it cannot."""
    from ..config import TrainSection
    from ..trainer.sizing import advise

    t = TrainSection()
    val = min(counts.get("val", 0), t.val_limit or counts.get("val", 0))
    advice = advise(val, counts.get("train", 0) + counts.get("val", 0), t.min_effect, t.alpha, t.acceptance)
    can = f"+{advice.detectable:.2f} or more" if advice.detectable is not None else "no effect"
    console.print(f"[dim]acceptance split: {val} val task(s) (train.val_limit = {t.val_limit}) detect {can} at "
                  f"alpha {t.alpha:g}; proposed val size for train.min_effect = {t.min_effect:g}: "
                  f"{advice.proposed or 'more than 4000'} task(s)[/]")
    if advice.warning:
        console.print(f"[yellow]warning: {advice.warning}[/]")


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


LABEL_MIN = 28  # the measure column may wrap down to this; value columns never wrap


def compare_table(console: Console, results: list[Any]) -> None:
    """Print `compare_tables` at the console's width."""
    for table in compare_tables(results, console.width):
        console.print(table)


def compare_tables(results: list[Any], width: int) -> list[Table]:
    """One column per arm and seed, one row per measure, in sections that keep units apart (accuracies, training
    costs, ratios); rows no arm has a value for are left out (`compare.table`). Columns that do not fit
    `width` go to further tables (one per seed when a seed's columns fit), never squeezed."""
    from ..compare.table import DASH, column_label, compare_sections

    sections = compare_sections(results)
    widths = [max(len(column_label(r)), *(len(cells[i]) for s in sections for _, cells in s.rows)) + 3
              for i, r in enumerate(results)]
    chunks = column_chunks(results, widths, width - LABEL_MIN - 4)
    tables = []
    for n, chunk in enumerate(chunks):
        part = f" ({n + 1} of {len(chunks)})" if len(chunks) > 1 else ""
        table = Table(title=f"Arms compared (same tasks, models, cache){part}")
        table.add_column("measure", min_width=LABEL_MIN)
        for i in chunk:
            table.add_column(column_label(results[i]), justify="right", no_wrap=True)
        first = True
        for section in sections:
            rows = [(label, cells) for label, cells in section.rows if any(cells[i] != DASH for i in chunk)]
            if not rows:  # e.g. a seed where fixed scored 0: no relative gain over it
                continue
            if not first:
                table.add_section()
            first = False
            table.add_row(f"[bold]{section.title}[/]", *([""] * len(chunk)))
            for label, cells in rows:
                table.add_row(label, *(cells[i] for i in chunk))
        tables.append(table)
    return tables


def column_chunks(results: list[Any], widths: list[int], room: int) -> list[list[int]]:
    """Column indexes split into tables whose columns fit in `room`: all in one when they fit, else one table
    per seed when each seed's columns fit, else as many columns per table as fit (at least one)."""
    if sum(widths) <= room:
        return [list(range(len(results)))]
    seeds = list(dict.fromkeys(r.seed for r in results))
    by_seed = [[i for i, r in enumerate(results) if r.seed == seed] for seed in seeds]
    if len(by_seed) > 1 and all(sum(widths[i] for i in group) <= room for group in by_seed):
        return by_seed
    chunks: list[list[int]] = [[]]
    for i, width in enumerate(widths):
        if chunks[-1] and sum(widths[j] for j in chunks[-1]) + width > room:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def compare_summary(console: Console, results: list[Any]) -> None:
    """Print `summary_shown`: mean ± 95% CI per arm over its seeds, or why there is none."""
    show(console, summary_shown(results))


def show(console: Console, items: list[Table | str]) -> None:
    """Tables as they are, plain lines dimmed (information, not warnings)."""
    for item in items:
        if isinstance(item, Table):
            console.print(item)
        else:
            console.print(item, style="dim", markup=False, highlight=False)


def summary_shown(results: list[Any]) -> list[Table | str]:
    """The per-arm summary tables over seeds, or the line saying why there are none."""
    from ..compare.results import summary_tables

    tables: list[Table | str] = list(summary_tables(results))
    return tables or ["one seed per arm: no confidence interval (use --seeds 2 or more, or pool other seeds' "
                      "compares with `ecdysis compare-summary`)"]


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
        said = round_verdict(rec)
        verdict = f"[{VERDICT_STYLE.get(said, 'yellow')}]{said}[/]"
        candidate = (f"{rec.candidate[:8]} {fmt(rec.candidate_score)} on {rec.decided_on}" if rec.candidate
                     else "–")
        rounds.add_row(str(rec.round), fmt(rec.train_score), f"{len(r.patterns)} ({rec.recurring})", candidate,
                       verdict, rec.stop or rec.reason or "")
    console.print(rounds)
    if run.accept_rule is not None:
        console.print(f"edits decided on {accept_rule_text(run.accept_rule)}", markup=False)
    if run.holdout is not None:
        console.print(run.holdout.line(), markup=False)
    decisions = [(f"{r.record.round}{label}", ev) for r in run.rounds for label, ev in decision_evidence(r.record)]
    if decisions:
        table = Table(title="Decisions: the evidence that decided each one")
        for col in ("round", "evidence", "compared", "tasks", "effect", "p", "stopped"):
            table.add_column(col, overflow="fold")
        for where, ev in decisions:
            table.add_row(where, ev.kind, f"{ev.current[:8]} -> {ev.candidate[:8]} on {ev.split}",
                          f"{ev.tasks}/{ev.pool} x{ev.trials}", f"{ev.effect:+.3f} (+{ev.wins} -{ev.losses})",
                          "–" if ev.p_value is None else f"{ev.p_value:.3g}", ev.stopped)
        console.print(table)
    lineage = Table(title="Harness lineage")
    key_column(lineage, "version", [n.id for n in run.lineage])
    for col in ("parent", "status", "note"):
        lineage.add_column(col)
    for n in run.lineage:
        lineage.add_row(n.id, (n.parent or "")[:8], n.status, n.note)
    console.print(lineage)
