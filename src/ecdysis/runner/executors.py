"""Where episodes run: the runner's one interface to local worker processes or a Ray cluster.

An executor runs one episode (a harness on one task and trial) and returns its trajectory; the runner
keeps everything else (concurrency, model calls and their cache and accounting, grading, recording), so
every executor yields the same store contents. An executor never raises for a failed episode: a harness
failure is a scored trajectory, and an episode the infrastructure lost (a Ray worker or node died) after
its bounded retries is recorded with termination `infra_error`, kept apart from harness failures.
"""

from __future__ import annotations

from typing import Protocol

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..sandbox.host import ChatHandler, UserHandler
from ..sandbox.view import SandboxView
from ..sandbox.workers import WorkerPool
from .episode_job import EpisodeJob, run_here

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    name: str

    async def run(self, episode: EpisodeJob, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
        """Run the episode; `chat` and `user` are the host's handlers for its model and user turns."""
        ...

    def prepare(self, view: SandboxView, env_name: str) -> None:
        """EpisodeJobs of this environment, seeing `view`, are coming: get ready for them (without waiting)."""
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

    async def run(self, episode: EpisodeJob, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
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


def make_executor(name: str, ray_address: str = "", slots: int = 2, retries: int = 2) -> Executor:
    """`local`, or `ray` (optional extra; connects to `ray_address`, `auto`, or starts a local cluster)."""
    if name == "local":
        return LocalExecutor(slots=slots, retries=retries)
    if name == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(address=ray_address, slots=slots, retries=retries)
    raise ValueError(f"unknown executor {name!r}; use one of {', '.join(EXECUTORS)}")
