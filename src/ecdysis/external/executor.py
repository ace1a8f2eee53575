"""Episodes of an agent program: the `Executor` the runner uses when `[agent]` names a command or a callable.

For each episode: the candidate harness is loaded (once per version: `LayerCache`), the episode gets a key on
the shared endpoint (`Endpoint`), the program runs with the task's public view and that key
(`program.run_program`), and its trajectory is what the endpoint saw plus how the program ended. The runner
does everything else as for the library's own loop (concurrency, the model layer, grading in the host,
recording), so every number it reports for built-in agents it reports for these. A crash, a non-zero exit,
a timeout or a missing answer is a recorded, scored episode; a harness that fails to load is a crash of that
episode. Exact replay (`trainer/rerun.py`) runs through here too: its chat handler serves the stored replies.

The endpoint and the harnesses' sandbox workers belong to the event loop that started them; they are stopped
when a batch ends (`idle`) with no episode running, and started again by the next episode.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..config import Config
from ..harness.manifest import HarnessError
from ..sandbox.host import ChatHandler, UserHandler
from ..sandbox.view import SandboxView
from .channel import EpisodeChannel
from .layers import EpisodeLayers, LayerCache, RunnerUpstream
from .program import MODEL_NAME, AgentProgram, AgentRun, run_program

log = logging.getLogger("ecdysis.external")
ISOLATION = "external program (the user's rights; harness code sandboxed)"



class AgentExecutor:
    """Runs each episode as one run of `program` against this executor's endpoint."""

    name = "agent"

    def __init__(self, program: AgentProgram, upstream_identity: str = "agent") -> None:
        self.program = program
        self.upstream_identity = upstream_identity
        from .endpoint import Endpoint  # FastAPI + uvicorn (the serve extra), checked by `agent_executor`

        self.endpoint = Endpoint()
        self.layers = LayerCache()
        self.active = 0
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _ready(self) -> None:
        """The endpoint running in this loop (a new loop after `asyncio.run` ended the last one)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._lock = loop, asyncio.Lock()
            self.endpoint.close()
            self.layers.close()
            self.layers = LayerCache()
        assert self._lock is not None
        async with self._lock:
            if not self.endpoint.running:
                self.endpoint.close()
                await self.endpoint.start()

    async def run(self, episode: object, chat: ChatHandler, user: UserHandler | None) -> Trajectory:
        """One episode (a runner `EpisodeJob`); never raises."""
        from ..runner.episode_job import EpisodeJob

        assert isinstance(episode, EpisodeJob)
        start = time.perf_counter()
        traj = Trajectory(task_id=episode.task.id, trial=episode.trial, harness_id=episode.harness.id,
                          isolation=ISOLATION)
        self.active += 1
        try:
            try:
                await self._ready()
                served = await self.layers.get(episode.harness)
            except HarnessError as exc:
                traj.termination, traj.traceback = "crash", f"the harness failed to load: {exc}"
                return traj
            except Exception as exc:  # noqa: BLE001 - the endpoint itself failed: not the agent's doing
                log.exception("agent endpoint failed")
                traj.termination, traj.traceback = INFRA_ERROR, f"the agent endpoint failed: {exc!r}"
                return traj
            public = episode.task.public_view()
            channel = EpisodeChannel(traj, EpisodeLayers(served, episode.task.public),
                                     RunnerUpstream(chat, self.upstream_identity, episode.trial),
                                     f"{episode.task.id}/{episode.trial}", self.program.max_requests)
            key = self.endpoint.register(channel)
            try:
                run = await run_program(self.program, public, {
                    "OPENAI_BASE_URL": self.endpoint.base_url, "OPENAI_API_BASE": self.endpoint.base_url,
                    "OPENAI_API_KEY": key, "ECDYSIS_MODEL": MODEL_NAME}, episode.limits.timeout_s)
            finally:
                self.endpoint.revoke(key)
            finish(traj, channel, run)
            return traj
        finally:
            self.active -= 1
            traj.wall_s = time.perf_counter() - start

    def prepare(self, view: SandboxView, env_name: str) -> None:
        return None

    async def idle(self) -> None:
        """A batch ended: with no episode running, stop the endpoint and the harnesses' workers."""
        if self._lock is None or self.active or self._loop is not asyncio.get_running_loop():
            return
        async with self._lock:
            if not self.active:
                await self.endpoint.stop()
                await self.layers.aclose()

    def close(self) -> None:
        self.endpoint.close()
        self.layers.close()


def finish(traj: Trajectory, channel: EpisodeChannel, run: AgentRun) -> None:
    """How the episode ended, from how the program ended and what the endpoint saw."""
    traj.add("agent", channel.requests, **run.record())
    traj.final_answer, traj.final_state = run.answer, run.state
    answered = run.answer is not None or bool(run.state)
    if run.error:
        traj.termination, detail = "crash", run.error
    elif run.timed_out:
        traj.termination, detail = "timeout", "the agent exceeded the task's time limit (sandbox.timeout_s)"
    elif run.exit_code != 0 or not answered:
        why = (f"the agent exited with status {run.exit_code}" if run.exit_code != 0
               else "the agent exited without an answer (no result file, nothing on stdout)")
        if channel.over_budget:
            traj.termination, detail = "max_turns", f"{why} after its request budget was spent"
        elif channel.upstream_error:
            traj.termination, detail = "model_error", f"{why} after the model failed: {channel.upstream_error}"
        else:
            traj.termination, detail = "crash", why
    else:
        traj.termination, detail = ("stopped" if channel.stopped else "answered"), ""
    if detail:
        traj.traceback = f"{detail}\n--- agent stderr (tail) ---\n{run.stderr_tail.strip()}".strip()


def agent_executor(config: Config, env: object) -> AgentExecutor:
    """The executor for `config`'s agent program. ConfigError when it cannot run here: a conversation
    environment (its simulated user talks to the library's loop), the Ray executor, or no FastAPI/uvicorn."""
    from ..config import ConfigError

    if getattr(env, "conversational", False):
        raise ConfigError(f"environment {config.env.name!r} is a conversation with a simulated user; an agent "
                          "program (agent.command / agent.callable) runs task environments only")
    if config.run.executor != "local":
        raise ConfigError("an agent program runs on this machine: use run.executor = 'local'")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"an agent program needs the endpoint's packages: pip install 'ecdysis[serve]' ({exc})"
                          ) from exc
    return AgentExecutor(AgentProgram.from_config(config.agent), f"agent:{config.agent.model}")
