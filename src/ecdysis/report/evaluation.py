"""The HTML report of a run that is not a training run (`ecdysis eval`, a compare arm's evaluations): each
evaluation's accuracy, terminations and failures by kind (first message, a crash's traceback), and its episodes
turn by turn, failures first. Read from the run store; no model calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jinja2 import Environment, PackageLoader

from ..agent.trajectory import Trajectory
from ..runner.failures import failures_of, grader_error_of
from ..store.db import RunStore
from .data import EvalRow, RunView, fmt

MAX_EPISODES = 200  # per evaluation; the rest are named with the command that shows one


@dataclass
class EpisodeView:
    trajectory: Trajectory
    failures: list[str]  # "kind: message" of each failure of the episode
    grader_error: str | None

    @property
    def anchor(self) -> str:
        t = self.trajectory
        return f"ep-{t.task_id}-{t.trial}"


@dataclass
class EvalSection:
    row: EvalRow
    episodes: list[EpisodeView] = field(default_factory=list)
    hidden: int = 0  # episodes beyond MAX_EPISODES, not rendered


def _order(t: Trajectory) -> tuple[int, str, int]:
    """Failures first (grader errors, then other failures, then wrong answers), then by task and trial."""
    return (0 if grader_error_of(t) else 1 if failures_of(t) else 2 if not t.passed else 3, t.task_id, t.trial)


def eval_sections(store: RunStore, run: RunView) -> list[EvalSection]:
    sections = []
    for row in run.evaluations:
        trajs = sorted(store.trajectories(row.id), key=_order)
        shown = [EpisodeView(t, [f"{f.kind}: {f.message}" for f in failures_of(t)], grader_error_of(t))
                 for t in trajs[:MAX_EPISODES]]
        sections.append(EvalSection(row, shown, max(0, len(trajs) - MAX_EPISODES)))
    return sections


def render_eval_report(store: RunStore, run: RunView) -> str:
    """The report of a run's evaluations as HTML text."""
    env = Environment(loader=PackageLoader("ecdysis.report", "templates"), autoescape=True)  # model text is data
    return env.get_template("eval_report.html.j2").render(
        run=run, sections=eval_sections(store, run), models=run.models(), fmt=fmt, store_path=str(store.path),
        max_episodes=MAX_EPISODES)
