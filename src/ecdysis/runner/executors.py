"""Where episodes run: the runner's one interface to local worker processes or a Ray cluster.

An executor runs one episode (a harness on one task and trial) and returns its trajectory; the runner
keeps everything else (concurrency, model calls and their cache and accounting, grading, recording), so
every executor yields the same store contents. An executor never raises for a failed episode: a harness
failure is a scored trajectory, and an episode the infrastructure lost (a Ray worker or node died) after
its bounded retries is recorded with termination `infra_error`, kept apart from harness failures.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..envs.base import Task
from ..harness.manifest import HarnessVersion
from ..sandbox.host import ChatHandler, SandboxLimits, UserHandler, run_in_sandbox
from ..sandbox.view import SandboxView, plugin_view
from ..sandbox.workers import WorkerPool

EXECUTORS = ("local", "ray")


@dataclass
class Episode:
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


def run_here(episode: Episode, chat: ChatHandler, user: UserHandler | None,
             pool: WorkerPool | None = None) -> Awaitable[Trajectory]:
    """The episode in a sandboxed worker on this machine (what every executor ends up running)."""
    return run_in_sandbox(episode.harness, episode.env_name, episode.env_options, episode.task, episode.trial,
                          chat, episode.limits, user=user, view=episode.view(), pool=pool)


class Executor(Protocol):
    name: str

    async def run(self, episode: Episode, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
        """Run the episode; `chat` and `user` are the host's handlers for its model and user turns."""
        ...

    def prepare(self, view: SandboxView, env_name: str) -> None:
        """Episodes of this environment, seeing `view`, are coming: get ready for them (without waiting)."""
        ...

    async def idle(self) -> None:
        """The batch ended: free what was held ready for the next episode."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Workers on this machine (bubblewrap-confined where available) from a `WorkerPool`: forked from a
    pre-imported zygote, or started while the previous episode runs, so no episode waits for an
    interpreter to start and import."""

    name = "local"

    def __init__(self, slots: int = 4, retries: int = 2) -> None:
        self.pool = WorkerPool(slots)
        self.retries = retries

    async def run(self, episode: Episode, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
        """An episode whose zygote died is run again (the pool starts a new zygote), up to `retries` times."""
        for _ in range(self.retries):
            traj = await run_here(episode, chat, user, self.pool)
            if traj.termination != INFRA_ERROR:
                return traj
        return await run_here(episode, chat, user, self.pool)

    def prepare(self, view: SandboxView, env_name: str) -> None:
        self.pool.prepare(view, env_name)

    async def idle(self) -> None:
        await self.pool.drain()

    def close(self) -> None:
        self.pool.close()


def infra_failure(episode: Episode, attempts: int, error: str) -> Trajectory:
    """The record of an episode the infrastructure lost `attempts` times (not the harness's fault)."""
    return Trajectory(task_id=episode.task.id, trial=episode.trial, harness_id=episode.harness.id,
                      termination="infra_error", isolation="ray",
                      traceback=f"lost by the infrastructure in {attempts} attempt(s); last error: {error}")


def make_executor(name: str, ray_address: str = "", slots: int = 2, retries: int = 2) -> Executor:
    """`local`, or `ray` (optional extra; connects to `ray_address`, `auto`, or starts a local cluster)."""
    if name == "local":
        return LocalExecutor(slots=slots, retries=retries)
    if name == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(address=ray_address, slots=slots, retries=retries)
    raise ValueError(f"unknown executor {name!r}; use one of {', '.join(EXECUTORS)}")
