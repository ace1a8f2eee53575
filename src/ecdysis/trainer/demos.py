"""What the library writes into a harness from the training split: demonstrations bootstrapped from passing
training trajectories (`add_demo`) and labelled examples retrieved per task (`add_examples`)."""

from __future__ import annotations

import json
from typing import Any

from ..agent.events import ObservationEvent
from ..agent.trajectory import Trajectory
from ..envs.base import Task, gold_text


def _demo_of(traj: Trajectory, tasks: dict[str, Task]) -> list[dict[str, Any]] | None:
    """One passing episode as demonstration items, or None if it would show an empty assistant turn."""
    if traj.tool_calls() or tasks[traj.task_id].user_scenario is not None:
        messages = [m for m in traj.conversation if m.get("role") in ("user", "assistant", "tool")]
        if not messages or any(m.get("role") == "assistant" and not (m.get("content") or "").strip()
                               and not m.get("tool_calls") for m in messages):
            return None
        return [{"messages": messages}]  # the calls and their results as real messages
    turns: list[dict[str, Any]] = []
    user = tasks[traj.task_id].prompt
    observations = iter(e.text for e in traj.of(ObservationEvent))
    for reply in traj.replies():
        if not reply.strip():
            return None
        turns.append({"user": user, "assistant": reply})
        user = next(observations, "")
    return turns or None


def bootstrap_demo(trajectories: list[Trajectory], tasks: dict[str, Task]) -> list[dict[str, Any]] | None:
    """A worked example from the shortest passing training trajectory: user/assistant turns for text episodes;
    for tool and conversation episodes the whole exchange as messages (assistant calls, tool results).
    A demonstration with an empty assistant turn is never returned."""
    passing = sorted((t for t in trajectories if t.passed and t.replies() and t.task_id in tasks),
                     key=lambda t: sum(map(len, t.replies())))
    return next((demo for t in passing if (demo := _demo_of(t, tasks)) is not None), None)


def example_format(trajectories: list[Trajectory]) -> str:
    """How an example's answer is written: a passing reply's last line with its answer as `{answer}`."""
    for t in sorted((t for t in trajectories if t.passed and t.final_answer and t.replies()),
                    key=lambda t: len(t.replies()[-1])):
        lines = [line for line in t.replies()[-1].strip().splitlines() if line.strip()]
        if lines and t.final_answer and t.final_answer in lines[-1]:
            return lines[-1].replace(t.final_answer, "{answer}", 1)
    return "Answer: {answer}"


def labelled_examples(tasks: dict[str, Task]) -> list[dict[str, str]]:
    """The training tasks (train split only) whose gold answer is plain text, as examples `{prompt, answer}`."""
    return [{"prompt": t.prompt, "answer": a} for t in tasks.values() if t.split == "train"
            and (a := gold_text(t.gold)) is not None]


def examples_file(tasks: dict[str, Task], trajectories: list[Trajectory], k: int) -> str | None:
    """`examples.json` from the training tasks given (the train split only) with their gold answers."""
    items = labelled_examples(tasks)
    if not items:
        return None
    return json.dumps({"k": k, "retriever": "bm25", "format": example_format(trajectories), "examples": items},
                      indent=1) + "\n"
