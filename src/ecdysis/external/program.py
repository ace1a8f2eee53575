"""The agent program: how one episode starts it, what it is given, and what is read back.

Contract (docs/agents.md): the program gets the task's public view as JSON in `ECDYSIS_TASK` and on stdin, and
an OpenAI-compatible endpoint of its own in `OPENAI_BASE_URL` / `OPENAI_API_KEY`. Its answer is, first found:
the file `ECDYSIS_RESULT` (JSON `{"answer": ..., "state": {...}}`, or plain text), else the last non-empty line
of stdout (a JSON object with `answer` there counts the same way). It runs with the user's rights (it is the
user's code), in its own process group, killed with everything it started at the task's time limit.

Its environment is the host's without what would let it bypass or see past the endpoint: no `ECDYSIS_*`
variables (data folders hold gold answers), no `OPENAI_*` settings and no variables named like API keys
(`*_API_KEY`, `*_TOKEN`, `*_SECRET`) unless `agent.pass_env` keeps them; `agent.env` adds variables.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import AgentSection, ConfigError

OUTPUT_TAIL = 16_000  # bytes of stdout / stderr kept
SECRET_NAME = re.compile(r"(_API_KEY|_TOKEN|_SECRET|_PASSWORD)$|^(ECDYSIS_|OPENAI_)")
MODEL_NAME = "ecdysis-agent"  # what /v1/models lists; any model name is accepted


@dataclass(frozen=True)
class AgentProgram:
    """A command (argv) run in `cwd` with `env` added; `label` is how reports name it."""

    argv: tuple[str, ...]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()
    max_requests: int = 100
    label: str = ""

    @classmethod
    def from_config(cls, agent: AgentSection) -> AgentProgram:
        """The configured program. ConfigError when both or neither of command/callable are set, or the
        command's program cannot be found."""
        if agent.command and agent.callable:
            raise ConfigError("agent.command and agent.callable are both set; give one")
        cwd = Path(agent.cwd or Path.cwd()).resolve()
        if not cwd.is_dir():
            raise ConfigError(f"agent.cwd {cwd} is not a folder")
        if agent.callable:
            if ":" not in agent.callable:
                raise ConfigError(f"agent.callable {agent.callable!r} should look like module:function")
            argv = (sys.executable, "-m", "ecdysis.external.call", agent.callable)
            label = agent.callable
        elif agent.command:
            argv = tuple(resolve_command(agent.command, cwd))
            label = " ".join(agent.command)
        else:
            raise ConfigError("no agent program: set agent.command (e.g. [\"python\", \"agent.py\"]) or "
                              "agent.callable (module:function)")
        return cls(argv, cwd, dict(agent.env), tuple(agent.pass_env), agent.max_requests, label)

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        """The program's environment: the host's minus keys and Ecdysis settings, then `env`, then `extra`."""
        keep = set(self.pass_env)
        out = {k: v for k, v in os.environ.items() if k in keep or not SECRET_NAME.search(k)}
        src = str(Path(__file__).resolve().parents[2])  # a callable imports ecdysis: keep it importable
        if "ecdysis.external.call" in self.argv:
            out["PYTHONPATH"] = os.pathsep.join(p for p in (src, out.get("PYTHONPATH", "")) if p)
        return out | self.env | extra


def resolve_command(command: list[str], cwd: Path) -> list[str]:
    """argv with a bare `python`/`python3` meaning the interpreter running Ecdysis (its packages), other
    programs found on PATH or relative to `cwd`. ConfigError naming the program when it is not found."""
    head, *rest = command
    if head in ("python", "python3"):
        return [sys.executable, *rest]
    if os.sep in head:
        path = (cwd / head) if not os.path.isabs(head) else Path(head)
        if not path.exists():
            raise ConfigError(f"agent.command: {path} does not exist")
        return [str(path), *rest]
    found = shutil.which(head)
    if found is None:
        raise ConfigError(f"agent.command: program {head!r} not found on PATH")
    return [found, *rest]


@dataclass
class AgentRun:
    """What one run of the program left: how it ended, its answer and state, the tails of its output."""

    exit_code: int | None
    timed_out: bool
    answer: str | None
    state: dict[str, Any]
    answer_source: str  # "file", "stdout", or "" (no answer)
    stdout_tail: str
    stderr_tail: str
    wall_s: float
    error: str = ""  # the program could not be started

    def record(self) -> dict[str, Any]:
        """The trajectory's `agent` event (without kind/turn)."""
        return {"exit_code": self.exit_code, "timed_out": self.timed_out, "answer_source": self.answer_source,
                "stdout_tail": self.stdout_tail[-2000:], "stderr_tail": self.stderr_tail[-4000:],
                "wall_s": round(self.wall_s, 4), "error": self.error}


def _answer_of(value: Any) -> tuple[str | None, dict[str, Any]] | None:
    """(answer, state) from a JSON result object, or None when it is not one."""
    if not isinstance(value, dict) or not ({"answer", "state"} & set(value)):
        return None
    answer = value.get("answer")
    state = value.get("state") if isinstance(value.get("state"), dict) else {}
    return (None if answer is None else answer if isinstance(answer, str) else json.dumps(answer)), state


def read_result(result_file: Path, stdout: str) -> tuple[str | None, dict[str, Any], str]:
    """(answer, state, source) from the result file if written, else from the last line of stdout."""
    if result_file.exists():
        text = result_file.read_text(errors="replace")
        with contextlib.suppress(json.JSONDecodeError):
            parsed = _answer_of(json.loads(text))
            if parsed is not None:
                return parsed[0], parsed[1], "file"
        return text.strip(), {}, "file"
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None, {}, ""
    with contextlib.suppress(json.JSONDecodeError):
        parsed = _answer_of(json.loads(lines[-1]))
        if parsed is not None:
            return parsed[0], parsed[1], "stdout"
    return lines[-1], {}, "stdout"


async def _tail(stream: asyncio.StreamReader, sink: bytearray) -> None:
    while chunk := await stream.read(65536):
        sink.extend(chunk)
        if len(sink) > OUTPUT_TAIL:
            del sink[: len(sink) - OUTPUT_TAIL]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_program(program: AgentProgram, task: dict[str, Any], endpoint: dict[str, str],
                      timeout_s: float) -> AgentRun:
    """Run the program once for `task` (its public view) with `endpoint` variables; never raises for what the
    program does (crash, non-zero exit, timeout, no answer)."""
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="ecdysis-agent-"))
    result_file = workdir / "result.json"
    task_json = json.dumps(task)
    env = program.environment({**endpoint, "ECDYSIS_TASK": task_json, "ECDYSIS_TASK_ID": str(task.get("id", "")),
                               "ECDYSIS_RESULT": str(result_file), "ECDYSIS_EPISODE_DIR": str(workdir),
                               "OPENAI_AGENTS_DISABLE_TRACING": "1", "PYTHONUNBUFFERED": "1"})
    stdout, stderr = bytearray(), bytearray()
    try:
        proc = await asyncio.create_subprocess_exec(
            *program.argv, cwd=program.cwd, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return AgentRun(None, False, None, {}, "", "", "", time.perf_counter() - start,
                        error=f"could not start {program.label!r}: {exc}")
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    readers = [asyncio.create_task(_tail(proc.stdout, stdout)), asyncio.create_task(_tail(proc.stderr, stderr))]
    timed_out = False
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(task_json.encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=timeout_s)
        except TimeoutError:
            timed_out = True
    finally:
        _kill_group(proc.pid)  # whatever it started goes with it
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), timeout=10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*readers), timeout=5)
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    answer, state, source = read_result(result_file, out) if not timed_out else (None, {}, "")
    shutil.rmtree(workdir, ignore_errors=True)
    return AgentRun(None if timed_out else proc.returncode, timed_out, answer, state, source, out, err,
                    time.perf_counter() - start)
