"""The `ray` executor: episodes run in Ray actors (on any node of a cluster) under the same sandbox.

Each actor runs the ordinary sandboxed worker (`run_in_sandbox`, forked from the actor's own zygote) on its
node; the episode's model and user turns come back to the driver through the actor (`next` / `respond`),
so model calls keep the driver's cache, accounting and rate limits, and results are recorded in the one
run store as each episode finishes. A dead actor (worker or node lost) costs only its in-flight episode,
which is retried on a fresh actor up to `retries` times and then recorded as an infrastructure failure; an
episode an actor reports as `infra_error` (its zygote died) is retried the same way.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..sandbox.host import ChatHandler, UserHandler
from ..sandbox.view import SandboxView
from ..sandbox.workers import WorkerPool
from .episode_job import EpisodeJob, infra_failure, run_here


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ValueError("the ray executor needs Ray: pip install 'ecdysis[ray]' (or use --executor local)") from exc
    return ray


class EpisodeWorker:
    """Actor body: runs one episode at a time and relays its turns to the driver."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count()
        self.episode: asyncio.Task[Trajectory] | None = None
        self.pool = WorkerPool(slots=1)  # the actor's zygotes: its episodes (one at a time) are forked from them

    def pid(self) -> int:
        import os

        return os.getpid()

    async def _relay(self, message: dict[str, Any]) -> dict[str, Any]:
        key = next(self.ids)
        future = self.pending[key] = asyncio.get_running_loop().create_future()
        await self.outbox.put({**message, "id": key})
        return await future

    async def start(self, episode: EpisodeJob, has_user: bool) -> None:
        async def chat(messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
            return await self._relay({"op": "chat", "messages": messages, "params": params})

        async def user(conversation: list[dict[str, str]]) -> dict[str, Any]:
            return await self._relay({"op": "user", "conversation": conversation})

        self.episode = asyncio.ensure_future(run_here(episode, chat, user if has_user else None, self.pool))

    async def next(self) -> dict[str, Any]:
        """The episode's next request to the driver, or {"op": "done", "trajectory": ...}."""
        assert self.episode is not None
        get = asyncio.ensure_future(self.outbox.get())
        await asyncio.wait({get, self.episode}, return_when=asyncio.FIRST_COMPLETED)
        if get.done():
            return get.result()
        get.cancel()
        traj = self.episode.result()
        self.episode = None
        return {"op": "done", "trajectory": traj.to_dict()}

    async def respond(self, key: int, reply: dict[str, Any]) -> None:
        self.pending.pop(key).set_result(reply)


class RayExecutor:
    """Episodes on Ray actors, `slots` of them alive at a time (one per in-flight episode)."""

    name = "ray"

    def __init__(self, address: str = "", slots: int = 2, retries: int = 2) -> None:
        ray = _ray()
        if not ray.is_initialized():
            try:
                if address:
                    ray.init(address=address, log_to_driver=False)
                else:  # a local cluster on this machine
                    ray.init(num_cpus=max(slots, 1), include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ValueError(f"cannot reach the Ray cluster at {address or 'a new local cluster'}: {exc}; "
                                 "check --ray-address (auto, ray://host:10001) or use --executor local") from exc
        self.ray = ray
        self.retries = retries
        self.actor_class = ray.remote(num_cpus=0.5, max_concurrency=4, max_restarts=0)(EpisodeWorker)
        self.ready: list[Any] = []  # actors waiting for an episode
        self.busy: set[Any] = set()  # actors running an episode now

    def _actor(self) -> Any:
        return self.ready.pop() if self.ready else self.actor_class.remote()

    async def _attempt(self, actor: Any, episode: EpisodeJob, chat: ChatHandler,
                       user: UserHandler | None) -> Trajectory:
        await actor.start.remote(episode, user is not None)
        while True:
            message = await asyncio.wait_for(actor.next.remote(), timeout=episode.limits.timeout_s + 120)
            if message["op"] == "done":
                return Trajectory.from_dict(message["trajectory"])
            if message["op"] == "user" and user is not None:
                reply = await user(message["conversation"])
            else:
                reply = await chat(message["messages"], message["params"])
            await actor.respond.remote(message["id"], reply)

    async def run(self, episode: EpisodeJob, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
        """Like the local executor: an episode the infrastructure lost (its actor died, or the actor's zygote
        died and it returned `infra_error`) runs again, up to `retries` times, then is recorded as lost."""
        error = ""
        for _ in range(self.retries + 1):
            actor = self._actor()
            self.busy.add(actor)
            try:
                traj = await self._attempt(actor, episode, chat, user)
            except (self.ray.exceptions.RayError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                self.ray.kill(actor, no_restart=True)
                continue
            finally:
                self.busy.discard(actor)
            self.ready.append(actor)  # alive: its pool replaces a dead zygote
            if traj.termination != INFRA_ERROR:
                return traj
            error = (traj.traceback or "").splitlines()[0] if traj.traceback else "infra_error"
        return infra_failure(episode, self.retries + 1, error)

    def prepare(self, view: SandboxView, env_name: str) -> None:
        return None  # each actor starts its own zygote on its node

    async def idle(self) -> None:
        return None  # actors are kept between batches (they are cheap to keep, slow to start)

    def close(self) -> None:
        for actor in [*self.ready, *self.busy]:
            self.ray.kill(actor, no_restart=True)
        self.ready.clear()
        self.busy.clear()
