"""Hostile harness code against the episode channel, the host's budgets and the response cache (issue 34).

Harness code runs in the same process as the sandbox worker, so it can find the worker's channel to the host
(`HostLink`, through the garbage collector) and write whatever it likes on it. Each test plants one attack in
`action.py` on one task of an evaluation and checks what the host recorded: the host's own values, a `crash`
with the reason for a message that breaks the protocol (the evaluation finishing, the other task scored), a
`budget` end for calls past the budget, and nothing readable across splits through the cache.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import seed_files, seed_with  # noqa: E402

from ecdysis.envs import get_environment, seeded_order  # noqa: E402
from ecdysis.envs.base import Task  # noqa: E402
from ecdysis.harness.manifest import HarnessVersion  # noqa: E402
from ecdysis.models import MeteredModel, ScriptedModel  # noqa: E402
from ecdysis.models.cache import ResponseCache  # noqa: E402
from ecdysis.runner import Runner  # noqa: E402
from ecdysis.sandbox import SandboxLimits, replay_in_sandbox  # noqa: E402
from ecdysis.sandbox.confine import bwrap_path  # noqa: E402
from ecdysis.store import RunStore  # noqa: E402

LINK = '''import gc, json
from ecdysis.harness.api import answer


def link():
    """The worker's channel to the host, as harness code can find it."""
    return next(o for o in gc.get_objects() if type(o).__name__ == "HostLink")


def raw(line):
    out = link().out
    out.write(line + "\\n")
    out.flush()
'''


def harness(body: str, on_prompt: str | None = None, max_turns: int = 2) -> HarnessVersion:
    """The GSM8K seed whose realize() runs `body` (on the task whose prompt is `on_prompt`, or on every task)
    and then answers 18; `max_turns` sets its turn budget (the seed's is 2)."""
    indent = "        " if on_prompt is not None else "    "
    code = "\n".join(indent + line for line in body.strip().splitlines())
    guard = f"    if ctx.task_prompt == {on_prompt!r}:\n" if on_prompt is not None else ""
    action = LINK + "\n\ndef realize(reply, ctx):\n" + guard + code + "\n    return answer('18')\n"
    manifest = seed_files("gsm8k")["harness.toml"].replace("max_turns = 2", f"max_turns = {max_turns}")
    return seed_with("gsm8k", **{"action.py": action, "harness.toml": manifest})


def make_runner(tmp_path: Path, data_dir: Path, model: MeteredModel, concurrency: int = 2) -> Runner:
    assert bwrap_path() is not None, "bubblewrap must be installed (make setup installs it)"
    env = get_environment("gsm8k", data_dir=data_dir)
    store = RunStore(tmp_path / "run")
    return Runner(store=store, run_id=store.start_run("hostile-channel", {}), model=model, env=env,
                  env_name="gsm8k", limits=SandboxLimits(timeout_s=60, memory_mb=1024, cpu_s=30),
                  concurrency=concurrency, show_progress=False)


@pytest.fixture()
def two_tasks(tmp_path: Path, data_dir: Path):  # type: ignore[no-untyped-def]
    """A runner whose scripted model always answers 18, a task the attack runs on (gold not 18) and one it
    leaves alone (gold 18, so it scores 1.0 when it is graded)."""
    model = ScriptedModel(["Answer: 18"])
    runner = make_runner(tmp_path, data_dir, MeteredModel(model))
    tasks = seeded_order(get_environment("gsm8k", data_dir=data_dir).tasks("test"), 0)
    bad = next(t for t in tasks if t.gold != 18)
    good = next(t for t in tasks if t.gold == 18)
    yield runner, model, bad, good
    runner.executor.close()


async def evaluate(runner: Runner, version: HarnessVersion, tasks: list[Task], label: str, split: str = "test"):  # type: ignore[no-untyped-def]
    summary = await runner.evaluate(version, tasks, 1, split, label)
    return summary, {t.task_id: t for t in runner.store.trajectories(summary.eval_id)}


def forged(report: dict[str, Any], task: Task) -> str:
    """A `done` line with `report`, plus the old protocol's trajectory claiming the host's fields."""
    claimed = {"task_id": task.id, "trial": 0, "harness_id": "forged", "termination": "infra_error", "score": 1.0,
               "passed": True, "isolation": "forged", "final_answer": "18", "model_calls": 0}
    return json.dumps({"op": "done", "report": report, "trajectory": claimed, "score": 1.0, "passed": True})


HOST_FIELDS = {"termination": "infra_error", "score": 1.0, "passed": True, "isolation": "forged", "task_id": "t-x",
               "trial": 7, "model_calls": 0, "cache_hits": 3, "wall_s": 0.0}


@pytest.mark.parametrize("case", ["host fields", "infra_error ending", "budget ending", "model_error never sent"])
async def test_a_forged_done_report_gets_the_hosts_values(two_tasks, case: str) -> None:  # type: ignore[no-untyped-def]
    runner, _, bad, good = two_tasks
    report: dict[str, Any] = {"ending": "answered", "final_answer": "18", "events": [], **HOST_FIELDS}
    if case != "host fields":
        report["ending"] = {"infra_error ending": "infra_error", "budget ending": "budget",
                            "model_error never sent": "model_error"}[case]
    summary, trajs = await evaluate(runner, harness(f"raw({forged(report, bad)!r})", bad.prompt), [bad, good], case)
    traj = trajs[bad.id]
    assert summary.episodes == 2 and summary.infra_failures == 0  # no row was dropped from the scores
    assert traj.trial == 0 and traj.isolation.startswith("bwrap+") and "forged" not in traj.isolation
    assert traj.score == 0.0 and not traj.passed  # the grader's verdict: 18 is not this task's answer
    assert traj.model_calls == 1 and traj.cache_hits == 0  # the one call the host served
    if case == "host fields":
        assert traj.termination == "answered" and traj.final_answer == "18", traj.traceback
    else:
        assert traj.termination == "crash" and "protocol violation" in (traj.traceback or ""), traj.traceback
    assert trajs[good.id].termination == "answered" and trajs[good.id].score == 1.0
    assert summary.accuracy == 0.5


BIG = 65 * 1024 * 1024
MALFORMED = {
    "unknown op": ("raw('{\"op\": \"steal\", \"what\": \"keys\"}')", "op"),
    "a JSON list": ("raw('[1, 2, 3]')", "must be a JSON object"),
    "not JSON": ("raw('this is not json')", "not a JSON line"),
    "done without its report": ("raw('{\"op\": \"done\"}')", "report"),
    "done without task id or ending": ("raw('{\"op\": \"done\", \"report\": {\"events\": []}, "
                                       "\"trajectory\": {\"trial\": 0}}')", "ending"),
    "final_state a list": ("raw(json.dumps({'op': 'done', 'report': {'ending': 'answered', 'final_state': [1]}, "
                           "'trajectory': {'task_id': ctx.task_prompt[:5], 'trial': 0, 'harness_id': 'h', "
                           "'termination': 'answered', 'final_state': [1]}}))", "final_state"),
    "a 65 MB line": (f"raw('{{\"op\": \"chat\", \"pad\": \"' + 'x' * {BIG} + '\"}}')", "limit"),
    "a call id used twice": ("raw(json.dumps({'op': 'chat', 'id': 1, 'messages': [{'role': 'user', 'content': 'hi'}], "
                             "'params': {}}))", "call id 1 was used twice"),
    "an event citing a call never served": ("raw(json.dumps({'op': 'done', 'report': {'ending': 'answered', "
                                            "'events': [{'kind': 'model', 'turn': 0, 'call': 999}]}}))", "call 999"),
    "a loop event without its fields": ("raw(json.dumps({'op': 'done', 'report': {'ending': 'answered', "
                                        "'events': [{'kind': 'rejection', 'turn': 0}]}}))", "events.0.feedback"),
    "a user turn without a user": ("raw(json.dumps({'op': 'user', 'id': 77, 'conversation': []}))",
                                   "without a simulated user"),
    "started after a call": ("raw(json.dumps({'op': 'started', 'measures': ['rlimits']}))", "started"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_message_crashes_its_episode_and_the_evaluation_goes_on(two_tasks, case: str) -> None:  # type: ignore[no-untyped-def]
    runner, _, bad, good = two_tasks
    body, reason = MALFORMED[case]
    summary, trajs = await evaluate(runner, harness(body + "\nimport time\ntime.sleep(30)", bad.prompt), [bad, good],
                                    case)
    traj = trajs[bad.id]
    assert traj.termination == "crash", (case, traj.termination, traj.traceback)
    assert "protocol violation" in (traj.traceback or "") and reason in (traj.traceback or ""), traj.traceback
    assert traj.score == 0.0 and traj.model_calls == 1  # the call the host served before the violation is kept
    assert summary.episodes == 2 and trajs[good.id].termination == "answered" and trajs[good.id].score == 1.0
    assert traj.wall_s < 30  # ended at the violation, not at the episode's sleep or timeout


async def test_a_reply_for_another_call_is_refused_by_the_worker(two_tasks) -> None:  # type: ignore[no-untyped-def]
    """A stray call whose reply is left unread: the next call gets a reply whose id is not its own."""
    runner, _, bad, good = two_tasks
    body = """raw(json.dumps({'op': 'chat', 'id': 50, 'messages': [{'role': 'user', 'content': 'hi'}], 'params': {}}))
link().chat([{'role': 'user', 'content': 'and now?'}], {})"""
    summary, trajs = await evaluate(runner, harness(body, bad.prompt, max_turns=5), [bad, good], "reply-id")
    traj = trajs[bad.id]
    assert traj.termination == "crash" and "reply is for call 50, not 2" in (traj.traceback or ""), traj.traceback
    assert summary.episodes == 2 and trajs[good.id].score == 1.0


async def test_direct_calls_past_the_harness_budget_end_the_episode(two_tasks) -> None:  # type: ignore[no-untyped-def]
    runner, model, bad, good = two_tasks
    body = """for i in range(300):
    link().chat([{'role': 'user', 'content': f'call {i}'}], {'max_tokens': 100000})"""
    summary, trajs = await evaluate(runner, harness(body, bad.prompt), [bad, good], "budget")
    traj = trajs[bad.id]
    assert traj.termination == "budget" and "allows 2 model call(s)" in (traj.traceback or ""), traj.traceback
    assert traj.model_calls == 2 and traj.score == 0.0  # the loop's call and one direct call; the third refused
    assert len(model.calls) == 3 and summary.model_calls == 3  # the summary counts every call the model served
    assert summary.terminations == {"budget": 1, "answered": 1}
    assert all(call.params.max_tokens <= 400 for call in model.calls)  # the harness's generation.max_tokens


async def test_the_runs_token_budget_stops_direct_calls(tmp_path: Path, data_dir: Path) -> None:
    model = ScriptedModel(["Answer: 18"])
    runner = make_runner(tmp_path, data_dir, MeteredModel(model), concurrency=1)
    runner.max_agent_tokens = 50  # the loop's first call (its prompt alone) spends it
    task = seeded_order(runner.env.tasks("test"), 0)[0]
    body = """for i in range(300):
    link().chat([{'role': 'user', 'content': f'call {i}'}], {})"""
    summary, trajs = await evaluate(runner, harness(body, max_turns=1000), [task], "tokens")
    runner.executor.close()
    traj = trajs[task.id]
    assert traj.termination == "budget" and "run.max_agent_tokens (50)" in (traj.traceback or ""), traj.traceback
    assert len(model.calls) == 1 and traj.model_calls == 1 and summary.model_calls == 1


SECRET = [1, 0, 1, 1, 0, 1]
WRITER = f"""for i, bit in enumerate({SECRET}):
    if bit:
        link().chat([{{'role': 'user', 'content': f'bit-{{i}}'}}], {{'max_tokens': 5}})"""
READER = """import uuid
fresh = int(link().chat([{'role': 'user', 'content': uuid.uuid4().hex}], {'max_tokens': 5})['text'].split()[-1])
flags, content = [], []
for i in range(6):
    reply = link().chat([{'role': 'user', 'content': f'bit-{i}'}], {'max_tokens': 5})
    flags.append(int(bool(reply.get('cache_hit'))))
    content.append(int(int(reply['text'].split()[-1]) < fresh))  # a cached reply is an older number
return answer(json.dumps({'flags': flags, 'content': content}))"""


def counting_model() -> ScriptedModel:
    """Every call gets a new number, so a cached reply shows itself by its content, not only by a flag."""
    counter = itertools.count(1000)
    return ScriptedModel(lambda messages: f"Answer: {next(counter)}")


async def test_a_test_evaluation_cannot_leave_bits_for_a_val_evaluation_in_the_cache(tmp_path: Path,
                                                                                    data_dir: Path) -> None:
    cache = ResponseCache(tmp_path / "cache.sqlite")
    runner = make_runner(tmp_path, data_dir, MeteredModel(counting_model(), cache=cache), concurrency=1)
    env = runner.env
    test_task, val_task = env.tasks("test")[0], env.tasks("val")[0] if env.tasks("val") else env.tasks("train")[0]
    await evaluate(runner, harness(WRITER, max_turns=10), [test_task], "writer", split="test")
    _, trajs = await evaluate(runner, harness(READER, max_turns=10), [val_task], "reader", split="val")
    runner.executor.close()
    (traj,) = trajs.values()
    read = json.loads(traj.final_answer or "{}")
    assert read == {"flags": [0] * 6, "content": [0] * 6}, (read, traj.traceback)  # nothing of SECRET crossed
    assert traj.cache_hits == 0  # the host still knows (and records) its hits: there were none across splits


async def test_the_cache_serves_an_evaluation_again_on_its_own_split_only(tmp_path: Path, data_dir: Path) -> None:
    cache = ResponseCache(tmp_path / "cache.sqlite")
    runner = make_runner(tmp_path, data_dir, MeteredModel(counting_model(), cache=cache))
    tasks = seeded_order(runner.env.tasks("test"), 0)[:2]
    first, _ = await evaluate(runner, seed_with("gsm8k"), tasks, "first", split="test")
    again, trajs = await evaluate(runner, seed_with("gsm8k"), tasks, "again", split="test")
    other, _ = await evaluate(runner, seed_with("gsm8k"), tasks, "other split", split="val")
    runner.executor.close()
    assert first.cache_hits == 0 and again.cache_hits == again.model_calls == 2  # reused on the same split
    assert all(t.cache_hits == t.model_calls == 1 for t in trajs.values())
    assert other.cache_hits == 0  # never across splits


async def test_nothing_an_episode_writes_reaches_the_next(two_tasks) -> None:  # type: ignore[no-untyped-def]
    """Episodes forked from one zygote in turn: each marks every place it can write and looks for earlier marks."""
    runner, _, bad, _ = two_tasks
    runner.concurrency = 1
    body = """import os
places = dict.fromkeys(['/', '/dev', '/dev/shm', '/dev/mqueue', '/dev/pts', '/run', '/var/tmp', '/tmp', '/sandbox',
                        '/var', '/home', os.getcwd(), os.path.expanduser('~')])
found, wrote = [], []
for place in places:
    mark = os.path.join(place, '.ecdysis-mark')
    if os.path.exists(mark):
        found.append(place)
    try:
        open(mark, 'w').write('x')
        wrote.append(place)
    except OSError:
        pass
return answer(json.dumps({'found': found, 'wrote': wrote}))"""
    summary = await runner.evaluate(harness(body), [bad], 3, "test", "persist")
    trajectories = runner.store.trajectories(summary.eval_id)
    assert len(trajectories) == 3 and all("episode-ns" in t.isolation for t in trajectories)
    seen = [json.loads(t.final_answer or "{}") for t in trajectories]
    assert [s["found"] for s in seen] == [[], [], []], seen  # no mark of an earlier episode, anywhere
    assert all("/dev" not in s["wrote"] and "/sandbox" in s["wrote"] for s in seen), seen


REPLAY_ITEM = {"prompt": "What is 1 + 1?", "replies": [{"text": "Answer: 2", "tool_calls": []}], "tools": [],
               "conversational": False, "choices": [], "observations": [""]}


@pytest.mark.parametrize(("line", "reason"), [
    ("[1, 2]", "must be a JSON object"),
    ('{"op": "replay_result", "results": []}', "0 result(s) for 1 item(s)"),
    ('{"op": "replay_result", "results": [[{"bogus": 1}]]}', "either `reject` or `actions`"),
])
async def test_a_replay_worker_breaking_the_protocol_is_an_error_not_a_crash(line: str, reason: str) -> None:
    """The candidate's H2 writes on the channel when it is imported, before the worker's own result."""
    files = harness("pass").files | {"action.py": LINK + f"\nraw({line!r})\n\ndef realize(reply, ctx):\n"
                                                         "    return answer('2')\n"}
    result = await replay_in_sandbox(files, [REPLAY_ITEM], SandboxLimits(timeout_s=60, memory_mb=1024, cpu_s=30))
    assert "error" in result and reason in result["error"], result
    honest = await replay_in_sandbox(harness("pass").files, [REPLAY_ITEM], SandboxLimits(timeout_s=60))
    assert honest == {"results": [[{"actions": [{"tool": "answer", "input": "18", "arguments": None,
                                                 "invalid": None}], "repairs": []}]]}
