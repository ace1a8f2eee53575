"""`ecdysis show RUN --task ID`: one episode turn by turn (text or `--json`), read from the run store.

The episode is picked from the run's evaluations that ran the task: the latest by default, or the one `--eval`
names (an evaluation id or prefix, or a label such as train, val, test, eval: its latest evaluation); and its
trial (`--trial`, default the lowest recorded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..agent.trajectory import Trajectory
from ..runner.failures import failures_of, grader_error_of, traceback_tail
from ..store.db import RunStore
from .common import fail

TEXT_LIMIT = 4000  # characters of one message shown in the terminal (`--json` has everything)
TRACEBACK_TAIL = 15


@dataclass
class EpisodeChoice:
    """One recorded episode of a run, with where else its task ran."""

    run_id: str
    evaluation: dict[str, Any]  # the evaluations row it belongs to
    trajectory: Trajectory
    ran_in: list[dict[str, Any]]  # every evaluation of the run that ran the task (oldest first)
    trials: list[int]  # the trials recorded for the task in this evaluation


def find_episode(store: RunStore, run_id: str, task_id: str, trial: int | None, eval_ref: str | None
                 ) -> EpisodeChoice:
    """The episode to show; exits 2 naming what exists when the task, evaluation or trial is not there."""
    evaluations = store.evaluations(run_id)
    episodes = {e["id"]: [t for t in store.trajectories(e["id"]) if t.task_id == task_id] for e in evaluations}
    ran_in = [e for e in evaluations if episodes[e["id"]]]
    if not ran_in:
        fail(f"task {task_id!r} did not run in {run_id} ({len(evaluations)} evaluation(s)); the tasks it ran "
             f"are listed by `ecdysis show {run_id} --json` (per_task)")
    chosen = ran_in
    if eval_ref:
        chosen = [e for e in ran_in if e["id"].startswith(eval_ref) or e["label"] == eval_ref]
        if not chosen:
            fail(f"no evaluation {eval_ref!r} of {run_id} ran task {task_id!r}; it ran in: "
                 + ", ".join(f"{e['id']} ({e['label']})" for e in ran_in))
        ids = {e["id"] for e in chosen if e["id"].startswith(eval_ref)}
        if len(ids) > 1:
            fail(f"--eval {eval_ref!r} matches {len(ids)} evaluations: {', '.join(sorted(ids))}; give more of the id")
    evaluation = chosen[-1]
    trials = sorted(t.trial for t in episodes[evaluation["id"]])
    pick = trials[0] if trial is None else trial
    found = next((t for t in episodes[evaluation["id"]] if t.trial == pick), None)
    if found is None:
        fail(f"task {task_id!r} has no trial {pick} in evaluation {evaluation['id']}; recorded trials: "
             f"{', '.join(map(str, trials))}")
    return EpisodeChoice(run_id, evaluation, found, ran_in, trials)  # type: ignore[arg-type]


def episode_json(choice: EpisodeChoice) -> dict[str, Any]:
    """What `show --task --json` prints: the episode, its grade, its failures and where else the task ran."""
    t, e = choice.trajectory, choice.evaluation
    return {
        "run_id": choice.run_id,
        "evaluation": {k: e[k] for k in ("id", "label", "split", "harness_id", "model", "created")},
        "ran_in": [{k: x[k] for k in ("id", "label", "split", "harness_id")} for x in choice.ran_in],
        "task_id": t.task_id, "trial": t.trial, "trials": choice.trials,
        "grade": {"score": t.score, "passed": t.passed, "detail": t.score_detail, "components": t.score_components,
                  "grader_error": grader_error_of(t)},
        "failures": [{"kind": str(f.kind), "message": f.message} for f in failures_of(t)],
        "traceback_tail": traceback_tail(t.traceback, TRACEBACK_TAIL) or None,
        "trajectory": t.to_dict(),
    }


def _clip(text: Any) -> str:
    text = str(text)
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + f" ... [{len(text) - TEXT_LIMIT} more characters]"


def _block(console: Console, text: Any) -> None:
    """Model, tool and user text: indented, printed as is (no markup, no highlighting)."""
    body = _clip(text).rstrip() or "(empty)"
    console.print("\n".join(f"    {line}" for line in body.splitlines()), markup=False, highlight=False)


def _arguments(call: dict[str, Any]) -> str:
    args = call.get("arguments")
    return args if isinstance(args, str) else json.dumps(args)


def _event(console: Console, e: dict[str, Any]) -> None:
    """One recorded event as a header line and its text."""
    kind, head = e.get("kind", "?"), f"[bold]turn {e.get('turn', 0)} · {escape(str(e.get('kind', '?')))}[/]"
    if kind == "model":
        usage = e.get("usage") or {}
        notes = [f"finish {e.get('finish_reason') or '?'}",
                 f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens"]
        notes += ["cache hit"] if e.get("cache_hit") else []
        notes += [f"{e['retries']} retries"] if e.get("retries") else []
        notes += ["not chosen by the vote"] if e.get("unchosen") else []
        console.print(f"{head} [dim]({escape(', '.join(notes))})[/]")
        _block(console, e.get("reply", ""))
        for call in e.get("tool_calls") or []:
            console.print(f"    call {call.get('name')}({_arguments(call)})", markup=False, highlight=False)
    elif kind == "action":
        body = json.dumps(e["arguments"]) if e.get("arguments") is not None else e.get("input", "")
        console.print(f"{head} {escape(str(e.get('tool')))}", highlight=False)
        _block(console, body)
    elif kind == "rejection":
        console.print(f"{head} [red]rule {escape(str(e.get('rule')))}[/]: the feedback sent back", highlight=False)
        _block(console, e.get("feedback", ""))
    elif kind == "repair":
        console.print(f"{head} {escape(str(e.get('name')))} applied", highlight=False)
    elif kind == "tool_error":
        console.print(f"{head} [red]{escape(str(e.get('tool')))}: {escape(str(e.get('error')))}[/]", highlight=False)
    elif kind == "user":
        console.print(f"{head}" + (" [dim](ended the conversation)[/]" if e.get("stop") else ""), highlight=False)
        _block(console, e.get("text", ""))
    elif kind == "stop":
        console.print(f"{head} {escape(str(e.get('reason', '')))}", highlight=False)
    elif kind in ("observation", "annotation"):
        console.print(head)
        _block(console, e.get("text", ""))
    else:
        console.print(head)
        _block(console, json.dumps({k: v for k, v in e.items() if k not in ("kind", "turn")}, default=str))


def print_episode(console: Console, choice: EpisodeChoice, run_dir: str) -> None:
    """The episode turn by turn: header, system prompt, task, each event, the exception, the grade."""
    t, e = choice.trajectory, choice.evaluation
    console.print(f"[bold]Episode[/] task {escape(t.task_id)}, trial {t.trial} · evaluation {e['id']} ({e['label']}, "
                  f"split {e['split']}, harness {e['harness_id'][:8]}) · run {choice.run_id}", highlight=False)
    if len(choice.ran_in) > 1:
        others = ", ".join(f"{x['id'][:12]} ({x['label']})" for x in choice.ran_in if x["id"] != e["id"])
        console.print(f"[dim]the task ran in {len(choice.ran_in)} evaluations of this run; this is the "
                      f"{'latest' if e is choice.ran_in[-1] else 'chosen'} one. Others: {others} (--eval ID)[/]",
                      highlight=False)
    if len(choice.trials) > 1:
        console.print(f"[dim]trials recorded: {', '.join(map(str, choice.trials))} (--trial N)[/]")
    console.print(f"termination [bold]{t.termination}[/] · score {t.score:.3f} ({'passed' if t.passed else 'failed'})"
                  f" · {t.model_calls} model call(s), {t.prompt_tokens}+{t.completion_tokens} tokens · "
                  f"{t.wall_s:.1f}s · isolation {t.isolation or '-'}", highlight=False)
    prompts = t.of_kind("prompt")
    if prompts:
        p = prompts[0]
        tools = ", ".join(x["name"] if isinstance(x, dict) else str(x) for x in p.get("tools") or [])
        console.print(f"[bold]system prompt[/] [dim](skills: {escape(', '.join(p.get('skills') or []) or '-')}; "
                      f"tools: {escape(tools or '-')})[/]", highlight=False)
        _block(console, p.get("system", ""))
    if t.conversation and t.conversation[0].get("role") == "user":
        console.print("[bold]user[/] [dim](the task)[/]")
        _block(console, t.conversation[0].get("content", ""))
    for event in t.events:
        if event.get("kind") != "prompt":
            _event(console, event)
    console.print(f"[bold]final answer[/] {escape(repr(t.final_answer))}", highlight=False)
    if t.traceback:
        console.print(f"[bold red]exception[/] [dim](traceback, last {TRACEBACK_TAIL} lines)[/]")
        _block(console, traceback_tail(t.traceback, TRACEBACK_TAIL))
    error = grader_error_of(t)
    grade = f"[bold red]grader error[/] {escape(error)}" if error else escape(t.score_detail or "-")
    console.print(f"[bold]grade[/] {t.score:.3f} ({'passed' if t.passed else 'failed'}): {grade}", highlight=False)
    extra = {k: v for k, v in (t.score_components or {}).items() if k != "grader_error"}
    if extra:
        console.print(f"[dim]grade components: {escape(json.dumps(extra, default=str))}[/]", highlight=False)
    for f in failures_of(t):
        console.print(f"[yellow]failure[/] {f.kind}: {escape(f.message)}", highlight=False)
    console.print(f"[dim]everything recorded: `ecdysis show {choice.run_id} --task {escape(t.task_id)} --trial "
                  f"{t.trial} --eval {e['id']} --run-dir {escape(run_dir)} --json`[/]", highlight=False)
