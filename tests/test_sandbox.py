"""Harness code misbehaving inside the sandbox: every case is a recorded failure; the batch goes on."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import seed_with

import ecdysis
from ecdysis.envs import get_environment, seeded_order
from ecdysis.models import MeteredModel, ScriptedModel
from ecdysis.runner import Runner
from ecdysis.sandbox import SandboxLimits, SandboxView
from ecdysis.sandbox.forkserver import ForkServer
from ecdysis.store import RunStore

HEADER = "from ecdysis.harness.api import answer\n"
BEHAVIOURS = {
    "raises": HEADER + "def realize(reply, ctx):\n    raise RuntimeError('boom in realize')\n",
    "import_error": ("import module_that_does_not_exist\n" + HEADER
                     + "def realize(reply, ctx):\n    return answer('1')\n"),
    "loops": HEADER + "def realize(reply, ctx):\n    while True:\n        pass\n",
    "memory": (HEADER + "def realize(reply, ctx):\n    block = bytearray(16 * 1024 ** 3)\n"
               "    return answer(str(len(block)))\n"),
    "network": "import socket\n" + HEADER + "def realize(reply, ctx):\n"
               "    socket.create_connection(('127.0.0.1', 9), timeout=1)\n    return answer('1')\n",
    "subprocess": "import subprocess\n" + HEADER + "def realize(reply, ctx):\n"
                  "    subprocess.run(['true'])\n    return answer('1')\n",
    "secrets_and_prints": "import os\n" + HEADER + "def realize(reply, ctx):\n"
                          "    print('noise on stdout')\n    return answer(os.environ.get('OPENAI_API_KEY', '18'))\n",
}
EXPECTED = {
    "raises": ("crash", "RuntimeError: boom in realize"),
    "import_error": ("crash", "ModuleNotFoundError"),
    "loops": ("timeout", "time limit"),
    "memory": ("crash", "MemoryError"),
    "network": ("crash", "network access is disabled"),
    "subprocess": ("crash", "starting processes is disabled"),
}


@pytest.fixture()
def runner_parts(tmp_path: Path, data_dir: Path):  # type: ignore[no-untyped-def]
    env = get_environment("gsm8k", data_dir=data_dir)
    tasks = seeded_order(env.tasks("test"), 0)[:2]
    store = RunStore(tmp_path / "run")
    run_id = store.start_run("test", {})
    model = MeteredModel(ScriptedModel(["Answer: 18"]))
    runner = Runner(store=store, run_id=run_id, model=model, env=env, env_name="gsm8k",
                    limits=SandboxLimits(timeout_s=8, memory_mb=1024, cpu_s=30), concurrency=2,
                    show_progress=False)
    return runner, tasks, store


async def test_misbehaving_harnesses_become_recorded_failures(runner_parts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-should-not-leak")
    for name, code in BEHAVIOURS.items():
        version = seed_with("gsm8k", **{"action.py": code})
        summary = await runner.evaluate(version, tasks, trials=1, split="test", label=name)
        assert summary.episodes == len(tasks), name
        trajectories = store.trajectories(summary.eval_id)
        assert len(trajectories) == len(tasks)
        for traj in trajectories:
            if name == "secrets_and_prints":
                assert traj.termination == "answered" and traj.final_answer == "18"
                assert traj.isolation.startswith("bwrap+") and "audit-hook" in traj.isolation
                continue
            termination, needle = EXPECTED[name]
            assert traj.termination == termination, (name, traj.traceback)
            assert needle in (traj.traceback or ""), (name, traj.traceback)
            assert traj.score == 0.0
            if name != "import_error":
                assert traj.model_calls == 1 and traj.replies() == ["Answer: 18"]  # the served call is kept


async def test_worker_killed_by_cpu_limit_is_a_crash(runner_parts) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    runner.limits = SandboxLimits(timeout_s=20, memory_mb=1024, cpu_s=1)
    version = seed_with("gsm8k", **{"action.py": BEHAVIOURS["loops"]})
    summary = await runner.evaluate(version, tasks[:1], label="cpu")
    traj = store.trajectories(summary.eval_id)[0]
    assert traj.termination == "crash"
    assert "SIGXCPU" in (traj.traceback or "") or "SIGKILL" in (traj.traceback or "")


async def test_agent_token_budget_stops_new_episodes(runner_parts) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    runner.concurrency = 1
    runner.max_agent_tokens = 1  # exhausted by the first episode
    summary = await runner.evaluate(seed_with("gsm8k"), tasks, label="budget")
    assert summary.episodes == 1 and runner.tokens_spent >= 1
    evaluation = next(e for e in store.evaluations(runner.run_id) if e["id"] == summary.eval_id)
    assert '"budget_exhausted": true' in evaluation["summary"] and '"complete": false' in evaluation["summary"]


STATE = ("import os\n" + HEADER + "def realize(reply, ctx):\n"
         "    seen = [p for p in ('/tmp/mark', 'mark') if os.path.exists(p)]\n"
         "    open('/tmp/mark', 'w').write('x')\n    open('mark', 'w').write('x')\n    return answer(str(seen))\n")


@pytest.mark.parametrize("mode", ["forked", "fresh processes"])
async def test_pooled_workers_serve_one_episode_each_and_do_not_outlive_the_batch(  # type: ignore[no-untyped-def]
        runner_parts, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, tasks, store = runner_parts
    if mode == "fresh processes":  # what a machine without nested namespaces gets
        monkeypatch.setattr(ForkServer, "start", classmethod(lambda cls, *args: None))
    runner.concurrency = 1  # episodes in sequence: each after the first gets a worker made ahead of time
    version = seed_with("gsm8k", **{"action.py": STATE})
    summary = await runner.evaluate(version, tasks * 1, trials=3, split="test", label="state")
    trajectories = store.trajectories(summary.eval_id)
    assert [t.final_answer for t in trajectories] == ["[]"] * len(tasks) * 3  # none saw an earlier one's files
    assert all(("episode-ns" in t.isolation) == (mode == "forked") for t in trajectories)
    pool = runner.executor.pool
    assert not any(pool._spares.values()) and not any(pool._forked.values())  # no idle worker left running
    if mode == "fresh processes":  # a zygote that cannot run here is not tried again for every batch
        assert pool._no_zygotes and not pool._unclaimed
    runner.executor.close()


async def test_a_dead_zygote_is_replaced_and_its_episodes_still_run(runner_parts) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    version = seed_with("gsm8k")
    await runner.evaluate(version, tasks[:1], label="before")
    pool = runner.executor.pool
    (future,) = pool._servers.values()
    zygote = future.result()
    os.killpg(zygote.proc.pid, signal.SIGKILL)  # the zygote and every episode it forked ahead are gone
    zygote.proc.wait()
    for label in ("zygote-gone", "zygote-replaced"):
        summary = await runner.evaluate(version, tasks, label=label)
        trajectories = store.trajectories(summary.eval_id)
        assert [t.termination for t in trajectories] == ["answered"] * len(tasks), label
    assert all("episode-ns" in t.isolation for t in trajectories)  # a new zygote serves the last batch
    (future,) = pool._servers.values()
    assert future.result() is not zygote
    runner.executor.close()


SLOW = HEADER + "import time\ndef realize(reply, ctx):\n    time.sleep(3)\n    return answer('18')\n"


@pytest.mark.parametrize("retries", [0, 1])
async def test_an_episode_whose_zygote_dies_is_an_infrastructure_failure_and_retried(  # type: ignore[no-untyped-def]
        runner_parts, retries: int) -> None:
    runner, tasks, store = runner_parts
    runner.executor.retries = retries
    version = seed_with("gsm8k", **{"action.py": SLOW})
    pool = runner.executor.pool

    async def kill_the_zygote() -> None:
        while not pool._servers or not next(iter(pool._servers.values())).done():
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # the episode is inside its 3 s realize
        zygote = next(iter(pool._servers.values())).result()
        os.killpg(zygote.proc.pid, signal.SIGKILL)

    killer = asyncio.create_task(kill_the_zygote())
    summary = await runner.evaluate(version, tasks[:1], label=f"zygote-killed-{retries}")
    await killer
    (traj,) = store.trajectories(summary.eval_id)
    if retries:  # run again (in a fresh worker process while the zygote is replaced), and this time it finishes
        assert traj.termination == "answered" and traj.final_answer == "18", traj.traceback
        assert traj.isolation.startswith("bwrap+"), traj.traceback
        assert summary.infra_failures == 0 and summary.episodes == 1
    else:  # kept apart from harness failures: not scored, run again by the next invocation
        assert traj.termination == "infra_error" and "zygote" in (traj.traceback or "")
        assert summary.infra_failures == 1 and summary.episodes == 0
    runner.executor.close()


async def test_each_harness_version_gets_its_own_zygote_and_idle_ones_are_retired(runner_parts) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    pool = runner.executor.pool
    first, second = seed_with("gsm8k"), seed_with("gsm8k", **{"action.py": STATE})
    await runner.evaluate(first, tasks, label="first")
    (key_first,) = pool._servers
    zygote_first = pool._servers[key_first].result()
    await runner.evaluate(second, tasks, label="second")
    (key_second,) = pool._servers  # the first harness's zygote had nothing in flight: ended
    assert key_first[-1] == first.id and key_second[-1] == second.id
    assert not zygote_first.alive() and pool._servers[key_second].result().alive()
    runner.executor.close()


async def test_a_zygote_prepared_ahead_is_claimed_by_the_first_harness_and_another_prepared(runner_parts) -> None:  # type: ignore[no-untyped-def]
    runner, tasks, store = runner_parts
    pool = runner.executor.pool
    runner.executor.prepare(SandboxView(), "gsm8k")  # what the workspace does while the models load
    (prepared,) = pool._unclaimed.values()
    summary = await runner.evaluate(seed_with("gsm8k"), tasks, label="claims")
    assert all("episode-ns" in t.isolation for t in store.trajectories(summary.eval_id))
    (claimed,) = pool._servers.values()
    assert claimed is prepared  # the batch's episodes were forked from the zygote started ahead
    (next_one,) = pool._unclaimed.values()  # and the batch's end started one for the next harness version
    assert next_one is not prepared and next_one.result() is not None and next_one.result().alive()
    runner.executor.close()


PRELOADING_PLUGIN = '''import os
from ecdysis.envs.gsm8k import GSM8K as environment, make_episode  # noqa: F401


def preload_sandbox():
    os.environ["PRELOADED_BY"] = str(os.getpid())  # runs in the zygote: its forks inherit it
'''


@pytest.mark.parametrize("mode", ["forked", "fresh processes"])
async def test_an_environment_preloads_its_episode_imports_once_in_the_zygote(  # type: ignore[no-untyped-def]
        tmp_path: Path, data_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "fresh processes":
        monkeypatch.setattr(ForkServer, "start", classmethod(lambda cls, *args: None))
    (tmp_path / "preloading_env.py").write_text(PRELOADING_PLUGIN)
    env = get_environment("gsm8k", data_dir=data_dir)
    tasks = seeded_order(env.tasks("test"), 0)[:3]
    store = RunStore(tmp_path / "run")
    runner = Runner(store=store, run_id=store.start_run("preload", {}), model=MeteredModel(ScriptedModel(["x"])),
                    env=env, env_name="preloading_env:environment", plugin_paths=[str(tmp_path)],
                    limits=SandboxLimits(timeout_s=20), concurrency=1, show_progress=False)
    probe = ("import os\n" + HEADER + "def realize(reply, ctx):\n"
             "    return answer(os.environ.get('PRELOADED_BY', 'none') + '/' + str(os.getpid()))\n")
    summary = await runner.evaluate(seed_with("gsm8k", **{"action.py": probe}), tasks, label="preload")
    seen = [(t.final_answer or "").split("/") for t in store.trajectories(summary.eval_id)]
    if mode == "forked":  # one zygote preloaded once; each episode is its own process (PID 1 of its namespace)
        assert len({by for by, _ in seen}) == 1 and seen[0][0] != "none" and {own for _, own in seen} == {"1"}
    else:
        assert [by for by, _ in seen] == ["none"] * 3
    runner.executor.close()


FROM_COPY = r'''
import asyncio, json, sys
sys.path.insert(0, sys.argv[2])
from helpers import seed_with
import ecdysis
from ecdysis.envs import get_environment, seeded_order
from ecdysis.models import MeteredModel, ScriptedModel
from ecdysis.runner import Runner
from ecdysis.sandbox import SandboxLimits
from ecdysis.store import RunStore

PROBE = """import os, ecdysis
from ecdysis.harness.api import answer
def realize(reply, ctx):
    return answer(ecdysis.__file__ + '|' + str(len(open(ecdysis.__file__).read())) + '|'
                  + ','.join(sorted(os.listdir(os.path.dirname(ecdysis.__file__)))))
"""

async def main():
    env = get_environment("gsm8k", data_dir=sys.argv[1])
    store = RunStore(sys.argv[3])
    runner = Runner(store=store, run_id=store.start_run("copy", {}), model=MeteredModel(ScriptedModel(["x"])),
                    env=env, env_name="gsm8k", limits=SandboxLimits(timeout_s=30), concurrency=2, show_progress=False)
    summary = await runner.evaluate(seed_with("gsm8k", **{"action.py": PROBE}), seeded_order(env.tasks("test"), 0)[:2],
                                    1, "test", "from-copy")
    runner.executor.close()
    episodes = [[t.isolation, t.termination, t.final_answer, t.traceback] for t in store.trajectories(summary.eval_id)]
    print(json.dumps({"package": ecdysis.__file__, "episodes": episodes}))

asyncio.run(main())
'''


def test_sandboxed_episodes_run_from_a_package_copy_under_tmp(tmp_path: Path, data_dir: Path) -> None:
    """The package (and so the sandbox's source bind) in a folder under /tmp, where each forked episode mounts
    a fresh tmpfs: the episode still sees the package's files (a plugin or checkout under /tmp works)."""
    copy = Path(tempfile.mkdtemp(dir="/tmp", prefix="ecdysis-copy-"))
    try:
        shutil.copytree(Path(ecdysis.__file__).parent, copy / "src" / "ecdysis",
                        ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": str(copy / "src")}
        out = subprocess.run([sys.executable, "-c", FROM_COPY, str(data_dir), str(Path(__file__).parent),
                              str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(copy)
    init = str(copy / "src" / "ecdysis" / "__init__.py")
    assert report["package"] == init  # the copy, not this checkout
    for isolation, termination, final_answer, traceback in report["episodes"]:
        assert "episode-ns" in isolation and termination == "answered", traceback
        path, size, listing = final_answer.split("|")
        assert path == init and int(size) > 0 and "sandbox" in listing.split(",")


def test_a_plugins_code_closure_follows_its_imports_and_nothing_else(tmp_path: Path) -> None:
    """What `plugin_view` binds: the module, its packages' __init__, the modules it imports (relative, absolute,
    inside functions), transitively; not a module nobody imports, nor data; declared files by name."""
    from ecdysis.sandbox.view import plugin_view

    pkg = tmp_path / "shop"
    (pkg / "tools").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "env.py").write_text("from . import pricing\nfrom .tools import cart\n\ndef make_episode(public, options):\n"
                                "    import shop_extra\n    return shop_extra\n")
    (pkg / "pricing.py").write_text("import json\nfrom .tools.rules import RULES\n")
    (pkg / "tools" / "__init__.py").write_text("")
    (pkg / "tools" / "cart.py").write_text("")
    (pkg / "tools" / "rules.py").write_text("RULES = []\n")
    (pkg / "gold.py").write_text("ANSWERS = {}\n")  # not imported: not bound
    (pkg / "tasks.jsonl").write_text("{}\n")
    (tmp_path / "shop_extra.py").write_text("")
    view = plugin_view("shop.env:environment", [str(tmp_path)], files=["tasks.jsonl"], hidden=["/x/hidden"])
    code = {str(Path(p).relative_to(tmp_path)) for p in view.read_only}
    assert code == {"shop/__init__.py", "shop/env.py", "shop/pricing.py", "shop/tools/__init__.py",
                    "shop/tools/cart.py", "shop/tools/rules.py", "shop_extra.py", "shop/tasks.jsonl"}
    assert view.import_paths == (str(tmp_path.resolve()),) and view.hidden == ("/x/hidden",)
    assert plugin_view("gsm8k", [str(tmp_path)]).read_only == ()  # a built-in environment adds nothing
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        plugin_view("shop.env:environment", [str(tmp_path)], files=["missing.csv"])
