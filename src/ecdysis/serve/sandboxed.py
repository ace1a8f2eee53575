"""The harness's own code (H2 `action.py`, H4 `regulate.py`) run in the OS sandbox for the whole life of `serve`.

Harness code is written by a model: the proxy, which holds the upstream's keys, does not import it. One
long-lived worker per served harness runs it under the sandbox's confinement (bubblewrap: no network, no
secrets, read-only system, unprivileged; rlimits and the audit hook inside), loaded once; every request
sends it the reply to realize, or the tool results to regulate, as one JSON line and waits for one line
back (a call that takes longer than `CALL_TIMEOUT_S` kills the worker: that request fails with 500 and the
next one starts a fresh worker). The library's own layers (repairs, validation, retrieval) stay in the
proxy process.

The worker side is `python -m ecdysis.serve.sandboxed` (reads the harness files, then requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

CALL_TIMEOUT_S = 10.0
LIMITS = {"memory_mb": 2048, "cpu_s": 10**7, "file_mb": 16}  # CPU is bounded per call by the host's timeout


class LayerCodeError(RuntimeError):
    """The sandboxed harness code failed, timed out or its worker died (the message says which)."""


def _command() -> tuple[list[str], dict[str, str], str, str]:
    """(argv, env, workdir, measures) of a worker, confined by bubblewrap where available."""
    from ..sandbox.confine import confine_argv
    from ..sandbox.workers import SRC_ROOT, worker_env

    workdir = tempfile.mkdtemp(prefix="ecdysis-serve-sbx-")
    command = [sys.executable, "-m", "ecdysis.serve.sandboxed"]
    env = worker_env(workdir)
    confined = confine_argv(command, env, SRC_ROOT, [], [])
    return (confined or command), (env if confined is None else {}), workdir, ("bwrap" if confined else "")


def _init(files: dict[str, str], measures: str) -> bytes:
    return (json.dumps({"files": files, "limits": LIMITS, "confined": measures}) + "\n").encode()


def probe(files: dict[str, str], timeout_s: float = 60.0) -> str:
    """Start a worker once and load the harness code in it; returns the isolation it got. Raises
    LayerCodeError with the worker's error (an import that fails, a missing function)."""
    argv, env, workdir, measures = _command()
    try:
        done = subprocess.run(argv, input=_init(files, measures), capture_output=True, timeout=timeout_s,
                              cwd=workdir, env=env or None, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LayerCodeError(f"the sandboxed harness code did not load within {timeout_s:g}s") from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [line for line in done.stdout.decode(errors="replace").splitlines() if line.strip()]
    first = json.loads(lines[0]) if lines else {}
    if "ready" not in first:
        raise LayerCodeError(first.get("error") or done.stderr.decode(errors="replace")[-2000:].strip()
                             or f"the sandbox worker exited with status {done.returncode}")
    return str(first["ready"])


class SandboxedLayers:
    """Host side: `workers` worker processes (each started on first use in the serving event loop), each
    serving one call at a time; a call takes whichever is free."""

    def __init__(self, files: dict[str, str], workers: int = 2) -> None:
        self.files = files
        self.isolation = ""
        self.size = max(1, workers)
        self._procs: list[asyncio.subprocess.Process | None] = [None] * self.size
        self._workdirs: list[str] = [""] * self.size
        self._free: asyncio.Queue[int] | None = None

    async def _start(self, slot: int) -> asyncio.subprocess.Process:
        argv, env, self._workdirs[slot], measures = _command()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            cwd=self._workdirs[slot], env=env or None, start_new_session=True, limit=16 * 1024 * 1024)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_init(self.files, measures))
        await proc.stdin.drain()
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), timeout=60) or b"{}")
        if "ready" not in first:
            self._kill(slot, proc)
            raise LayerCodeError(first.get("error") or "the sandbox worker exited before loading the harness")
        self.isolation = str(first["ready"])
        return proc

    def _kill(self, slot: int, proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        shutil.rmtree(self._workdirs[slot], ignore_errors=True)

    async def call(self, op: str, payload: dict[str, Any]) -> Any:
        """One request to the harness code; its result, or LayerCodeError."""
        if self._free is None:
            self._free = asyncio.Queue()
            for slot in range(self.size):
                self._free.put_nowait(slot)
        slot = await self._free.get()
        try:
            proc = self._procs[slot]
            if proc is None or proc.returncode is not None:
                proc = self._procs[slot] = await self._start(slot)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps({"op": op, **payload}) + "\n").encode())
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), timeout=CALL_TIMEOUT_S)
            except (TimeoutError, ConnectionError, BrokenPipeError) as exc:
                self._kill(slot, proc)
                self._procs[slot] = None
                raise LayerCodeError(f"harness code: no answer within {CALL_TIMEOUT_S:g}s ({exc.__class__.__name__}); "
                                     "its worker was restarted") from exc
            if not line:
                self._procs[slot] = None
                raise LayerCodeError("harness code: its sandbox worker died (restarted for the next request)")
            reply = json.loads(line)
            if "error" in reply:
                raise LayerCodeError(reply["error"])
            return reply["result"]
        finally:
            self._free.put_nowait(slot)

    async def aclose(self) -> None:
        """Stop the workers and reap them in the serving loop (their pipes close with the loop still running)."""
        for slot, proc in enumerate(self._procs):
            self._procs[slot] = None
            if proc is None:
                continue
            self._kill(slot, proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=10)
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()

    def close(self) -> None:
        for slot, proc in enumerate(self._procs):
            if proc is not None and proc.returncode is None:
                self._kill(slot, proc)


# --- the worker, inside the sandbox ----------------------------------------------------------------

def main() -> int:
    from ..sandbox.worker import HostLink, isolate

    # not niced like an episode's worker: every request waits on this one
    link = HostLink(sys.stdin, os.fdopen(os.dup(1), "w", encoding="utf-8"))
    os.dup2(2, 1)  # harness code may print: keep the channel private
    sys.stdout = sys.stderr
    try:
        from ..agent.loop import load_module, load_realize
        from ..harness.api import ToolSpec, Verdict
        from ..harness.manifest import version_from_files
        from ..harness.repairs import REPAIRS_FILE, parse_repairs
        from .codec import harness_reply, outcome_record, realize_outcome, state_of

        init = link.receive()
        harness = version_from_files(init["files"], origin="harness")
        root = Path.cwd() / "harness"
        harness.write(root)
        sys.path.insert(0, str(root))
        limits = init["limits"]
        isolation = isolate(limits["memory_mb"], limits["cpu_s"], limits["file_mb"], init.get("confined", ""))
        realize = load_realize(harness, root)
        repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
        regulate = None
        if harness.manifest.files.regulate:
            regulate = load_module(root / harness.manifest.files.regulate, "harness_regulate").regulate
    except BaseException as exc:  # noqa: BLE001 - reported to the host
        link.send({"error": f"harness code failed to load: {traceback.format_exception_only(exc)[-1].strip()}"})
        return 1
    link.send({"ready": isolation})
    while True:
        try:
            request = link.receive()
        except EOFError:
            return 0
        try:
            if request["op"] == "realize":
                tools = tuple(ToolSpec.from_record(t) for t in request["tools"])
                outcome = realize_outcome(realize, repairs, harness_reply(request["text"], request["calls"]), tools,
                                          request["turn"], request["task"])
                result: Any = outcome_record(outcome)
            else:
                result = []
                for s in request["states"]:
                    state = state_of(s)
                    verdict = regulate(state) if regulate is not None else Verdict()
                    if not isinstance(verdict, Verdict):
                        raise TypeError(f"regulate() must return a Verdict, got {verdict!r}")
                    result.append({"annotation": verdict.annotation, "stop": verdict.stop, "reason": verdict.reason})
            link.send({"result": result})
        except Exception as exc:  # noqa: BLE001 - harness code failing is the request's error
            link.send({"error": f"{request.get('op')}: {traceback.format_exception_only(exc)[-1].strip()}"})


if __name__ == "__main__":
    sys.exit(main())
