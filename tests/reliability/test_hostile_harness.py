"""Hostile harness code against the real sandbox (bubblewrap): every escape must be blocked.

Each hostile `action.py` tries one escape and reports what it saw as its final answer, so the test
checks what the code could reach, not only whether it crashed. A test fails if an escape works.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import seed_with  # noqa: E402

from ecdysis.envs import get_environment, seeded_order  # noqa: E402
from ecdysis.harness.manifest import version_from_files  # noqa: E402
from ecdysis.models import MeteredModel, ScriptedModel  # noqa: E402
from ecdysis.runner import Runner  # noqa: E402
from ecdysis.sandbox import SandboxLimits  # noqa: E402
from ecdysis.sandbox.confine import bwrap_path  # noqa: E402
from ecdysis.store import RunStore  # noqa: E402

SECRET = "sk-hostile-test-secret"
HEADER = "import ctypes, glob, os, socket\nfrom ecdysis.harness.api import answer\n"


def attack(body: str) -> str:
    """An action.py whose realize() runs `body` (which sets `seen`) and answers with it."""
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    return HEADER + "def realize(reply, ctx):\n    seen = ''\n" + indented + "\n    return answer(str(seen)[:2000])\n"


def gsm8k_runner(tmp_path: Path, data_dir: Path, concurrency: int, timeout_s: float):  # type: ignore[no-untyped-def]
    """A runner on `concurrency` GSM8K test tasks (one per slot) with a scripted model, in the real sandbox."""
    assert bwrap_path() is not None, "bubblewrap must be installed (make setup installs it)"
    env = get_environment("gsm8k", data_dir=data_dir)
    store = RunStore(tmp_path / "run")
    runner = Runner(store=store, run_id=store.start_run("hostile", {}), model=MeteredModel(ScriptedModel(["x"])),
                    env=env, env_name="gsm8k", limits=SandboxLimits(timeout_s=timeout_s, memory_mb=1024, cpu_s=30),
                    concurrency=concurrency, show_progress=False)
    return runner, store, env, seeded_order(env.tasks("test"), 0)[:concurrency]


@pytest.fixture()
def hostile(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    runner, store, env, tasks = gsm8k_runner(tmp_path, data_dir, concurrency=1, timeout_s=20)

    async def run(name: str, code: str):  # type: ignore[no-untyped-def]
        summary = await runner.evaluate(seed_with("gsm8k", **{"action.py": code}), tasks, 1, "test", name)
        (traj,) = store.trajectories(summary.eval_id)
        assert traj.isolation.startswith("bwrap+"), traj.isolation
        return traj

    return run, tmp_path, data_dir, env


async def test_shell_through_ctypes_cannot_touch_the_host(hostile) -> None:  # type: ignore[no-untyped-def]
    run, tmp_path, data_dir, _ = hostile
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    traj = await run("ctypes-shell", attack(f"""
cmd = "touch {marker}; cat {data_dir}/gsm8k/test.jsonl > /sandbox/stolen 2>&1; id -u > /sandbox/uid"
rc = ctypes.pythonapi.system(cmd.encode())
seen = str(rc) + '|' + open('/sandbox/stolen').read()[:200] + '|' + open('/sandbox/uid').read()
"""))
    assert not marker.exists()  # the host's files are not reachable, not even its /tmp
    assert traj.final_answer is not None and "No such file" in traj.final_answer  # the task data is not there
    assert traj.final_answer.strip().endswith("65534")  # an unprivileged uid


async def test_host_environment_and_processes_are_invisible(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    traj = await run("proc-environ", attack("""
found = []
for path in glob.glob('/proc/[0-9]*/environ'):
    try:
        found.append(open(path, 'rb').read().decode(errors='replace'))
    except OSError as exc:
        found.append(type(exc).__name__)
seen = str(len(glob.glob('/proc/[0-9]*'))) + '|' + '\\n'.join(found) + '|' + repr(dict(os.environ))
"""))
    assert traj.final_answer is not None and SECRET not in traj.final_answer
    processes = int(traj.final_answer.split("|")[0])
    assert processes <= 5  # a new PID namespace: bwrap's init and the worker, not the host's processes
    assert str(os.getpid()) not in traj.final_answer.split("|")[0]


async def test_no_network_not_even_the_hosts_loopback(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[bool] = []

    def accept() -> None:
        server.settimeout(8)
        try:
            server.accept()
            accepted.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    # a child interpreter (started through ctypes, which the worker already loaded) has no audit hook:
    # only the network namespace stands between it and the host's loopback
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    traj = await run("network", attack(f"""
import shlex, sys
probe = {probe!r}
cmd = shlex.quote(sys.executable) + ' -c ' + shlex.quote(probe) + ' > /sandbox/net 2>&1'
rc = ctypes.pythonapi.system(cmd.encode())
out = open('/sandbox/net').read()
seen = 'connected' if 'connected' in out else 'blocked: ' + out[-80:]
"""))
    thread.join(10)
    server.close()
    assert not accepted and traj.final_answer is not None and traj.final_answer.startswith("blocked")


async def test_cannot_write_the_package_store_or_home(hostile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run, run_dir, _, _ = hostile
    import ecdysis

    package = Path(ecdysis.__file__).parent
    traj = await run("writes", attack(f"""
out = []
targets = ({str(package / 'pwned.py')!r}, {str(run_dir / 'run' / 'ecdysis.sqlite')!r}, {str(Path.home() / 'pwned')!r})
for target in targets:
    try:
        open(target, 'a').write('x')
        out.append('wrote ' + target)
    except OSError as exc:
        out.append(type(exc).__name__)
seen = ','.join(out)
"""))
    assert traj.final_answer is not None and "wrote" not in traj.final_answer
    assert not (package / "pwned.py").exists() and not (Path.home() / "pwned").exists()


async def test_no_process_outlives_the_episode(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    tag = f"{uuid.uuid4().int % 10**6 + 1000000}"
    traj = await run("orphan", attack(f"""
seen = ctypes.pythonapi.system(b"sleep {tag} >/dev/null 2>&1 &")
"""))
    assert traj.termination == "answered"
    leftover = subprocess.run(["pgrep", "-f", f"sleep {tag}"], capture_output=True, text=True).stdout.strip()
    assert leftover == ""  # the PID namespace died with the worker


async def test_memory_and_disk_bombs_are_recorded_failures(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    traj = await run("memory", attack("block = bytearray(8 * 1024 ** 3)"))
    assert traj.termination == "crash" and "MemoryError" in (traj.traceback or "")
    traj = await run("disk", attack("open('/sandbox/big', 'wb').write(b'x' * (200 * 1024 * 1024))"))
    assert traj.termination == "crash"  # RLIMIT_FSIZE (64 MB) stops it inside the 256 MB private tmpfs


async def test_gold_files_inside_installed_packages_are_masked(hostile) -> None:  # type: ignore[no-untyped-def]
    run, _, _, env = hostile
    from tau2.utils.utils import DATA_DIR

    gold = Path(DATA_DIR) / "tau2" / "domains" / "mock" / "tasks.json"
    code = attack(f"seen = len(open({str(gold)!r}).read())")
    readable = await run("gold-visible", code)
    assert int(readable.final_answer or 0) > 1000  # the package is bound read-only: the probe can see files
    env.sandbox_hidden = [str(gold)]  # what tau2 environments declare for their task files
    masked = await run("gold-masked", code)
    assert masked.final_answer == "0"


async def test_fork_bomb_is_bounded(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    traj = await run("fork-bomb", attack("""
libc = ctypes.pythonapi  # already loaded: no dlopen for the audit hook to see
forks, stopped = 0, False
for _ in range(3000):  # each child sleeps; without a process limit all 3000 would be created
    pid = libc.fork()
    if pid == 0:
        libc.pause()
    if pid < 0:
        stopped = True
        break
    forks += 1
seen = f'{forks}|{stopped}'
"""))
    assert traj.final_answer is not None, (traj.termination, traj.traceback)
    forks, stopped = traj.final_answer.split("|")
    assert int(forks) < 1000 and stopped == "True", traj.final_answer  # the task limit refused the fork


# Episodes forked from one zygote: each probe runs in a child interpreter started through ctypes (so no audit
# hook stands in its way) and looks for its sibling while both run; a shared namespace would show up as a
# second bind failing, a file or process of the other episode, or a connection to the other's listener.
SIBLING_PROBE = r"""
import json, os, socket, sys, time
start, seen = time.time(), {}
tag = sys.argv[1]
for folder in ('/sandbox', '/tmp', '/dev/shm'):
    open(os.path.join(folder, 'mark-' + tag), 'w').write(tag)
binds = {}
for name, family, address in (('abstract', socket.AF_UNIX, '\0ecdysis-sibling'),
                              ('loopback', socket.AF_INET, ('127.0.0.1', 47123))):
    server = socket.socket(family)
    try:
        server.bind(address)
        server.listen(4)
        binds[name] = 'bound'
    except OSError as exc:
        binds[name] = type(exc).__name__
    globals()['keep_' + name] = server
time.sleep(2.5)  # both episodes are now running
seen['marks'] = sorted(m for folder in ('/sandbox', '/tmp', '/dev/shm') for m in os.listdir(folder) if 'mark-' in m)
seen['proc'] = sorted(os.listdir('/proc'))
alive = []
for pid in range(1, 400):
    try:
        os.kill(pid, 0)
        alive.append(pid)
    except OSError:
        pass
seen['signalable'] = alive
seen['binds'] = binds
seen['span'] = [start, time.time()]
print(json.dumps(seen))
"""


async def test_episodes_forked_from_one_zygote_cannot_see_each_other(tmp_path: Path, data_dir: Path) -> None:
    runner, store, _, tasks = gsm8k_runner(tmp_path, data_dir, concurrency=2, timeout_s=30)
    code = attack(f"""
import shlex, sys, uuid
open('/sandbox/probe.py', 'w').write({SIBLING_PROBE!r})
tag = uuid.uuid4().hex[:8]
cmd = shlex.quote(sys.executable) + ' /sandbox/probe.py ' + tag + ' > /sandbox/out 2>&1'
ctypes.pythonapi.system(cmd.encode())
seen = tag + '|' + open('/sandbox/out').read()
""")
    summary = await runner.evaluate(seed_with("gsm8k", **{"action.py": code}), tasks, 1, "test", "siblings")
    trajectories = store.trajectories(summary.eval_id)
    reports = []
    for traj in trajectories:
        assert "episode-ns" in traj.isolation, traj.isolation  # forked from the zygote, not a fresh process
        tag, _, report = (traj.final_answer or "").partition("|")
        reports.append((tag, json.loads(report)))
    (tag_a, a), (tag_b, b) = reports
    assert a["span"][0] < b["span"][1] and b["span"][0] < a["span"][1]  # the two episodes ran at the same time
    for tag, seen in reports:
        assert seen["binds"] == {"abstract": "bound", "loopback": "bound"}  # no shared network namespace
        assert seen["marks"] == [f"mark-{tag}"] * 3  # its own files only, in each writable place
        assert seen["proc"] == ["self"]
        assert len(seen["signalable"]) <= 3  # the episode's own worker, shell and probe: no sibling, no zygote
    runner.executor.close()


async def test_an_episode_killing_everything_it_can_does_not_hurt_the_next(hostile) -> None:  # type: ignore[no-untyped-def]
    run, *_ = hostile
    killer = attack("""
import shlex, sys
probe = 'import os, signal; os.kill(-1, signal.SIGKILL)'
seen = ctypes.pythonapi.system((shlex.quote(sys.executable) + ' -c ' + shlex.quote(probe)).encode())
""")
    first = await run("kill-all", killer)
    assert "episode-ns" in first.isolation
    after = await run("after-kill-all", attack("seen = 'still here'"))
    assert after.termination == "answered" and after.final_answer == "still here"


# A plugin written like examples/helpdesk: its tasks (text and gold of every split) sit next to its module.
# The harness reads every file it can find in the plugin's folder and under every sys.path entry (files older
# than the test are skipped outside the plugin's folder: the installed packages cannot hold this test's tasks).
PLUGIN = '''import json
from pathlib import Path
from ecdysis.envs.base import NoToolEpisode, Score, Task
from {name}_helpers import normalise

HERE = Path(__file__).resolve().parent


class Leaky:
    name, tool_names, sandbox_files = "{name}:environment", (), ()

    def tasks(self, split):
        rows = [json.loads(line) for line in (HERE / "tasks.jsonl").read_text().splitlines()]
        return [Task(id=r["id"], split=split, prompt=r["prompt"], gold=r["gold"]) for r in rows if r["split"] == split]

    def grade(self, task, answer, final_state):
        return Score(float(normalise(answer) == task.gold), normalise(answer) == task.gold)


def environment(data_dir=None, seed=0, **options):
    env = Leaky()
    env.sandbox_files = tuple(options.get("sandbox_files", ()))
    return env


def make_episode(public, options):
    return NoToolEpisode()
'''
READ_EVERYTHING = '''import json, os, sys
from ecdysis.harness.api import answer
MARKS = tuple(bytes.fromhex(h) for h in {marks!r})  # hex here, so this file is not a hit itself

def realize(reply, ctx):
    import {name}
    folder = os.path.dirname(os.path.abspath({name}.__file__))
    hits, read = [], 0
    for root in [folder, *sys.path]:
        for dirpath, _, names in os.walk(root or "."):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    if not dirpath.startswith(folder) and os.stat(path).st_mtime < {since}:
                        continue
                    data = open(path, "rb").read()
                except OSError:
                    continue
                read += 1
                hits += [path] if any(m in data for m in MARKS) else []
    return answer(json.dumps({{"listing": sorted(os.listdir(folder)), "hits": sorted(set(hits)), "read": read}}))
'''


def leaky_plugin(folder: Path) -> str:
    """A plugin in `folder` with its tasks, a data folder and an unimported module beside it; its module name."""
    name = f"leaky_env_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(PLUGIN.format(name=name))
    (folder / f"{name}_helpers.py").write_text("def normalise(text):\n    return (text or '').strip()\n")
    (folder / f"{name}_unused.py").write_text("ANSWERS = {'t0': 'GOLD-unused-module'}\n")
    rows = [{"id": f"t{i}", "split": split, "prompt": f"TASKTEXT-{i} say hi", "gold": f"GOLD-{split}-{i}"}
            for i, split in enumerate(("train", "train", "val", "test"))]
    (folder / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (folder / "data").mkdir()
    (folder / "data" / "answers.json").write_text(json.dumps({r["id"]: r["gold"] for r in rows}))
    (folder / "needed.txt").write_text("needed by episodes\n")
    (folder / "control.txt").write_text("GOLD-control: declared on purpose\n")
    return name


async def read_everything(folder: Path, tmp_path: Path, **options: Any) -> tuple[Any, Any]:
    """One forked episode of the plugin in `folder` whose harness reads everything; (trajectory, its report)."""
    name = leaky_plugin(folder)
    env = get_environment(f"{name}:environment", search=[folder], **options)
    store = RunStore(tmp_path / f"run-{name}")
    runner = Runner(store=store, run_id=store.start_run("leaky", {}), model=MeteredModel(ScriptedModel(["x"])),
                    env=env, env_name=f"{name}:environment", plugin_paths=[str(folder)],
                    limits=SandboxLimits(timeout_s=60, memory_mb=1024, cpu_s=40), concurrency=1, show_progress=False)
    code = READ_EVERYTHING.format(name=name, since=time.time() - 5, marks=[b"TASKTEXT-".hex(), b"GOLD-".hex()])
    summary = await runner.evaluate(seed_with("gsm8k", **{"action.py": code}), env.tasks("train")[:1], 1, "train",
                                    "read-everything")
    runner.executor.close()
    (traj,) = store.trajectories(summary.eval_id)
    assert "episode-ns" in traj.isolation and traj.termination == "answered", (traj.isolation, traj.traceback)
    return traj, json.loads(traj.final_answer or "{}")


@pytest.mark.parametrize("under", ["/var/tmp", "/tmp"])
async def test_a_plugins_tasks_and_gold_next_to_its_module_stay_on_the_host(tmp_path: Path, under: str) -> None:
    folder = Path(tempfile.mkdtemp(dir=under, prefix="ecdysis-plugin-"))
    try:
        traj, seen = await read_everything(folder, tmp_path)
    finally:
        shutil.rmtree(folder)
    name = seen["listing"][0].removesuffix(".py")
    assert seen["listing"] == [f"{name}.py", f"{name}_helpers.py"]  # its code and the module it imports only
    assert seen["hits"] == [] and seen["read"] > 2, seen  # no task text, no gold of any split, anywhere
    assert traj.final_answer is not None and "GOLD-" not in traj.final_answer


@pytest.mark.parametrize("under", ["/var/tmp", "/tmp"])
async def test_a_declared_sandbox_file_is_the_one_file_added(tmp_path: Path, under: str) -> None:
    folder = Path(tempfile.mkdtemp(dir=under, prefix="ecdysis-plugin-"))
    try:
        _, seen = await read_everything(folder, tmp_path, sandbox_files=["control.txt"])
    finally:
        shutil.rmtree(folder)
    name = seen["listing"][1].removesuffix(".py")
    assert seen["listing"] == ["control.txt", f"{name}.py", f"{name}_helpers.py"]
    assert seen["hits"] == [str(folder / "control.txt")]  # the probe finds gold where it is: there, and only there


async def test_the_helpdesk_example_copied_to_a_folder_of_ones_own_keeps_its_tickets(tmp_path: Path) -> None:
    """The issue's reproduction: examples/helpdesk copied elsewhere, `env.plugin_path` naming it, a harness that
    reads what it can: only the module is there, no ticket and no gold action of any split."""
    from ecdysis.config import load_config
    from ecdysis.workspace import Workspace

    folder = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="ecdysis-helpdesk-"))
    try:
        shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "helpdesk", folder, dirs_exist_ok=True)
        ws = Workspace.open(load_config(None, ['env.name="helpdesk_env:environment"', f'env.plugin_path=["{folder}"]',
                                               'agent.model="scripted:x"', f'run.run_dir="{tmp_path / "run"}"',
                                               "run.progress=false", f'cache.path="{tmp_path / "c.sqlite"}"']))
        code = READ_EVERYTHING.format(name="helpdesk_env", since=time.time() - 5,
                                      marks=[b"Ticket:".hex(), b'"split": "'.hex()])
        files = ws.harness().files
        manifest = files["harness.toml"].replace('action = ""', 'action = "action.py"')
        harness = version_from_files({**files, "harness.toml": manifest, "action.py": code}, origin="probe")
        runner = ws.runner(ws.store.start_run("probe", {}))
        summary = await runner.evaluate(harness, ws.tasks("test", None)[:1], 1, "test", "read-everything")
        (traj,) = ws.store.trajectories(summary.eval_id)
        ws.close()
    finally:
        shutil.rmtree(folder)
    assert traj.termination == "answered" and "episode-ns" in traj.isolation, traj.traceback
    seen = json.loads(traj.final_answer or "{}")
    assert seen["listing"] == ["helpdesk_env.py"] and seen["hits"] == [] and seen["read"] >= 1, seen
