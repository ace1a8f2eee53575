"""The `ray` executor on a real local Ray cluster (ray.init on this machine): the same scores and store
contents as the `local` executor, with the scripted and the embedded model; a Ray worker killed mid-batch
costs only its episode, retried a bounded number of times, then recorded as an infrastructure failure."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra; `make test` installs it
from helpers import jsonl_project

from ecdysis.config import load_config
from ecdysis.models import Message, ScriptedModel
from ecdysis.workspace import Workspace

ROWS = [{"id": f"q{i}", "prompt": f"Add {i} and {i + 3}.", "answer": str(2 * i + 3), "split": "test"}
        for i in range(5)]
VOLATILE = ("wall_s", "latency_s", "model_time_s")  # timings differ run to run, whatever the executor


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def answer(messages: list[Message]) -> str:
    a, b = map(int, [w.strip(".") for w in messages[-1].content.split() if w.strip(".").isdigit()][:2])
    return f"Answer: {a + b if a != 3 else 0}"


def workspace(tmp_path: Path, executor: str, model: str = "scripted:agent", *overrides: str) -> Workspace:
    cfg = load_config(None, [*jsonl_project(tmp_path, ROWS), f'agent.model="{model}"',
                             f'run.run_dir="{tmp_path / executor}"', f'run.executor="{executor}"',
                             f'cache.path="{tmp_path / executor / "cache.sqlite"}"', *overrides])
    return Workspace.open(cfg)


def stable(traj: Any) -> dict[str, Any]:
    """A trajectory's stored contents without timings."""
    data = traj.to_dict()
    for key in VOLATILE:
        data.pop(key, None)
    for event in data["events"]:
        for key in VOLATILE:
            event.pop(key, None)
    return data


async def evaluate(ws: Workspace, run_id: str = "eval-x") -> Any:
    runner = ws.runner(run_id)
    return await runner.evaluate(ws.harness(), ws.tasks("test", None), 1, "test", "eval")


async def test_ray_and_local_give_the_same_scores_and_store(tmp_path: Path) -> None:
    results = {}
    for executor in ("local", "ray"):
        ws = workspace(tmp_path, executor)
        ws.backends["agent|scripted:agent"] = ScriptedModel(answer, name="adder")
        summary = await evaluate(ws)
        results[executor] = (summary, [stable(t) for t in ws.store.trajectories(summary.eval_id)])
        ws.close()
    local, on_ray = results["local"], results["ray"]
    assert on_ray[0].per_task == local[0].per_task and on_ray[0].accuracy == 0.8  # q0 is answered wrongly
    assert on_ray[1] == local[1]


async def test_ray_with_the_embedded_model_matches_local(tmp_path: Path, smollm_path: Path) -> None:
    results = {}
    for executor in ("local", "ray"):
        ws = workspace(tmp_path, executor, "local:smollm2-135m", "cache.enabled=false")
        harness = Path(ws.config.agent.harness)
        manifest = (harness / "harness.toml").read_text()
        (harness / "harness.toml").write_text(manifest.replace("max_tokens = 512", "max_tokens = 24"))
        summary = await evaluate(ws)
        trajectories = ws.store.trajectories(summary.eval_id)
        results[executor] = (summary.per_task, [t.replies() for t in trajectories], sum(t.model_calls for t in
                                                                                         trajectories))
        ws.close()
    assert results["ray"] == results["local"]
    assert results["ray"][2] >= len(ROWS)  # the embedded model answered every episode, through the driver


class Killer:
    """A scripted model that kills the Ray actor running the episode when it sees `victim`'s prompt."""

    def __init__(self, ws: Workspace, victim: str, times: int) -> None:
        self.ws, self.victim, self.times, self.kills = ws, victim, times, 0

    def __call__(self, messages: list[Message]) -> str:
        if f"Add {self.victim} " in messages[-1].content and self.kills < self.times:
            self.kills += 1
            (actor,) = self.ws.executor.busy  # concurrency 1: the one in flight
            os.kill(ray.get(actor.pid.remote()), signal.SIGKILL)
        return answer(messages)


async def test_killed_worker_is_retried_then_recorded_as_infrastructure_failure(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ray", "scripted:agent", "run.concurrency=1", "run.episode_retries=1",
                   "cache.enabled=false")  # every call reaches the model (the killer)
    killer = Killer(ws, victim="2", times=1)  # killed once: the retry finishes the episode
    ws.backends["agent|scripted:agent"] = ScriptedModel(killer, name="adder")
    summary = await evaluate(ws, "eval-once")
    assert killer.kills == 1 and summary.episodes == 5 and summary.infra_failures == 0
    assert summary.per_task["q2"] == [1.0]

    killer = Killer(ws, victim="4", times=10)  # killed on every attempt: 2 attempts (1 retry), then recorded
    ws.backends["agent|scripted:agent"] = ScriptedModel(killer, name="adder")
    ws.models.clear()
    summary = await evaluate(ws, "eval-always")
    assert killer.kills == 2
    assert summary.infra_failures == 1 and summary.episodes == 4 and "q4" not in summary.per_task
    lost = [t for t in ws.store.trajectories(summary.eval_id) if t.task_id == "q4"]
    assert lost[0].termination == "infra_error" and "2 attempt(s)" in (lost[0].traceback or "")
    assert summary.accuracy == 0.75  # over the episodes that ran (q0 wrong): the lost one is not a harness failure

    killer.times = 0  # the next run of the same evaluation retries only the lost episode
    rerun = await evaluate(ws, "eval-always")
    assert rerun.episodes == 5 and rerun.infra_failures == 0 and rerun.per_task["q4"] == [1.0]
    ws.close()


def children(pid: int) -> list[int]:
    """`pid`'s child processes (a thread's children are listed under that thread), [] once it is gone."""
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    except OSError:
        return []


def zygotes_below(pid: int) -> list[int]:
    """The pids of every zygote (its bubblewrap process) among `pid`'s descendants: the one serving the
    episode in flight, and any started ahead for the next evaluation (which one serves is a race)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        try:
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if current != pid and b"ecdysis.sandbox.zygote" in cmdline:
            found.append(current)  # its own descendants are the zygote's interpreter and episodes
            continue
        queue.extend(children(current))
    return found


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, queue = [], [pid]
    while queue:
        found.append(queue.pop(0))
        queue.extend(children(found[-1]))
    return found


def dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


class ZygoteKiller(Killer):
    """Kills the zygotes of the Ray actor running the episode, the one that forked it among them (the actor
    lives: it returns `infra_error`). The reply is sent only once every process of the killed zygotes is dead:
    the zygote's namespace is torn down after its bubblewrap process dies (`--die-with-parent`), and an episode
    answered before that could still finish."""

    def __call__(self, messages: list[Message]) -> str:
        if f"Add {self.victim} " in messages[-1].content and self.kills < self.times:
            (actor,) = self.ws.executor.busy
            zygotes = zygotes_below(ray.get(actor.pid.remote()))
            assert zygotes, "the actor's episode was not forked from a zygote"
            doomed = [p for zygote in zygotes for p in tree(zygote)]
            for zygote in zygotes:
                os.killpg(zygote, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not all(dead(p) for p in doomed):
                assert time.monotonic() < deadline, f"still alive 30 s after the kill: {doomed}"
                time.sleep(0.01)
            self.kills += 1
        return answer(messages)


async def test_an_infra_error_from_an_actor_is_retried_then_recorded(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "ray", "scripted:agent", "run.concurrency=1", "run.episode_retries=1",
                   "cache.enabled=false")
    killer = ZygoteKiller(ws, victim="2", times=1)  # the actor reports infra_error once: the retry finishes it
    ws.backends["agent|scripted:agent"] = ScriptedModel(killer, name="adder")
    summary = await evaluate(ws, "eval-zygote-once")
    assert killer.kills == 1 and summary.episodes == 5 and summary.infra_failures == 0
    assert summary.per_task["q2"] == [1.0]

    ws.executor.retries = 0  # no retry left: the actor's infra_error is recorded, kept out of the scores
    killer = ZygoteKiller(ws, victim="4", times=1)
    ws.backends["agent|scripted:agent"] = ScriptedModel(killer, name="adder")
    ws.models.clear()
    summary = await evaluate(ws, "eval-zygote-lost")
    assert killer.kills == 1 and summary.infra_failures == 1 and "q4" not in summary.per_task
    (lost,) = [t for t in ws.store.trajectories(summary.eval_id) if t.task_id == "q4"]
    assert lost.termination == "infra_error" and "1 attempt(s)" in (lost.traceback or "")
    assert "zygote" in (lost.traceback or ""), lost.traceback
    ws.close()
