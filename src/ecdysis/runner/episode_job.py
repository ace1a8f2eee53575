"""One episode as a job for an executor (plain data: it crosses process and node boundaries), how it runs on
this machine, and the record of one the infrastructure lost. Every executor (executors.py, ray_executor.py)
builds on these.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from ..agent.trajectory import Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..sandbox.host import ChatHandler, SandboxLimits, UserHandler, run_in_sandbox
from ..sandbox.view import SandboxView, plugin_view
from ..sandbox.workers import WorkerPool


@dataclass
class EpisodeJob:
    """Everything a worker needs to run one episode (plain data: it crosses process and node boundaries)."""

    harness: HarnessVersion
    env_name: str
    env_options: dict[str, Any]
    task: Task
    trial: int
    limits: SandboxLimits
    plugin_paths: list[str] = field(default_factory=list)  # folders the environment's plugin is imported from
    hidden: list[str] = field(default_factory=list)  # the environment's `sandbox_hidden`: masked
    files: list[str] = field(default_factory=list)  # the environment's `sandbox_files`: bound read-only

    def view(self) -> SandboxView:
        """What of the host this episode sees besides the runtime (computed where it runs)."""
        return plugin_view(self.env_name, self.plugin_paths, self.files, self.hidden)


def run_here(episode: EpisodeJob, chat: ChatHandler, user: UserHandler | None,
             pool: WorkerPool | None = None) -> Awaitable[Trajectory]:
    """The episode in a sandboxed worker on this machine (what every executor ends up running)."""
    return run_in_sandbox(episode.harness, episode.env_name, episode.env_options, episode.task, episode.trial,
                          chat, episode.limits, user=user, view=episode.view(), pool=pool)


def infra_failure(episode: EpisodeJob, attempts: int, error: str) -> Trajectory:
    """The record of an episode the infrastructure lost `attempts` times (not the harness's fault)."""
    return Trajectory(task_id=episode.task.id, trial=episode.trial, harness_id=episode.harness.id,
                      termination="infra_error", isolation="ray",
                      traceback=f"lost by the infrastructure in {attempts} attempt(s); last error: {error}")


