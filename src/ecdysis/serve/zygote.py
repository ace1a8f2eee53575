"""Sandbox side of `serve`'s harness code: a template process that forks one fresh worker per conversation.

`python -m ecdysis.serve.zygote ROOT LIMITS` runs under bubblewrap (started by `sandbox.forkserver.ForkServer`,
same control protocol as the episode zygote: `fork` plus a channel and a stderr descriptor, answered with
the worker's pid). ROOT is a read-only copy of the harness. The template imports the library and the
installed modules the harness code imports (read from its import statements), but never runs harness code:
what harness code does at import (threads, shared memory, open descriptors, patched functions) would
otherwise reach every worker, and so every conversation. Each worker enters fresh namespaces
(`sandbox.nested`: private tmpfs for every writable place, its own PID, network and IPC namespaces), applies
the sandbox's rlimits and audit hook, imports the harness code, says `Ready`, and answers the requests of
one conversation (`serve.messages`) until the host ends it.

`python -m ecdysis.serve.zygote --once ROOT LIMITS CONFINED` is the same worker as a fresh process, on
stdin/stdout: the host's fallback where nested namespaces are unavailable.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..harness.manifest import HarnessVersion

PRELOAD = ("ecdysis.serve.layers", "ecdysis.serve.messages", "ecdysis.sandbox.framing", "ecdysis.sandbox.worker",
           "ecdysis.sandbox.nested", "ecdysis.agent.loop", "ecdysis.harness.manifest")
MAX_REQUEST = 64 * 1024 * 1024  # the host's request (trusted; bounded all the same)
SETTLE_ROUNDS, SETTLE_S = 4, 0.02  # short sleeps of a loaded child before it waits for its request (see _settle)


def preload_imports(root: Path) -> list[str]:
    """Import the modules the harness code imports from outside its own folder (installed library code, not
    the harness's), so that each worker does not import them again. Returns those that imported."""
    local = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    names: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    loaded = []
    for name in sorted(n for n in names if n.split(".")[0] not in local):
        try:
            import_module(name)
            loaded.append(name)
        except BaseException:  # noqa: BLE001, S112 - the child reports the import error of its own harness
            continue
    return loaded


def _send(out: socket.socket | int, message: Any) -> None:
    from ..sandbox.framing import encode

    data = encode(message)
    if isinstance(out, socket.socket):
        out.sendall(data)
    else:
        view = memoryview(data)
        while view:
            view = view[os.write(out, view):]


def _answer(request: Any, realize: Callable[..., Any] | None, regulate: Callable[..., Any] | None,
            repairs: list[Any]) -> Any:
    """The reply to one request, computed by the harness code loaded in this process."""
    from ..harness.api import ToolSpec, Verdict
    from .layers import harness_reply, realized_outcome
    from .messages import ActionRecord, Failed, Realized, RealizeRequest, VerdictRecord, Verdicts

    try:
        if isinstance(request, RealizeRequest):
            assert realize is not None, "this harness has no action layer"
            tools = tuple(ToolSpec.from_record(t) for t in request.tools)
            reply = harness_reply(request.text, [c.model_dump() for c in request.calls])
            o = realized_outcome(realize, repairs, reply, tools, request.turn, request.task)
            return Realized(id=request.id, text=o.text, actions=[ActionRecord.of(a) for a in o.actions],
                            repairs=o.repairs, reject_rule=o.reject_rule, feedback=o.feedback)
        verdicts = []
        for record in request.states:
            verdict = regulate(record.state()) if regulate is not None else Verdict()
            if not isinstance(verdict, Verdict):
                raise TypeError(f"regulate() must return a Verdict, got {verdict!r}")
            verdicts.append(VerdictRecord(annotation=verdict.annotation, stop=verdict.stop, reason=verdict.reason))
        return Verdicts(id=request.id, verdicts=verdicts)
    except BaseException as exc:  # noqa: BLE001 - harness code failing is this request's error
        return Failed(id=request.id, error=f"{request.op}: {traceback.format_exception_only(exc)[-1].strip()}")


def serve_requests(inp: int, out: int, root: Path, limits: dict[str, Any], confined: str,
                   harness: HarnessVersion | None = None) -> int:
    """In a fresh process: apply the sandbox's limits, load the harness code (`harness`: its files, read by the
    template), say Ready (or LoadFailed), then answer the requests that arrive on `inp` on `out`, one at a time
    (the host sends one conversation's requests only), until the host closes the channel or kills us."""
    from ..agent.loop import load_module, load_realize
    from ..harness.manifest import load_harness
    from ..harness.repairs import REPAIRS_FILE, parse_repairs
    from ..sandbox.worker import isolate
    from .messages import LayerRequest, LoadFailed, Ready

    channel = socket.socket(fileno=out) if inp == out else None
    try:
        sys.path.insert(0, str(root))
        isolation = isolate(limits["memory_mb"], limits["cpu_s"], limits["file_mb"], confined, limits.get("max_tasks"))
        harness = harness or load_harness(root)
        realize = load_realize(harness, root) if harness.manifest.files.action else None
        regulate = None
        if harness.manifest.files.regulate:
            regulate = load_module(root / harness.manifest.files.regulate, "harness_regulate").regulate
        repairs = parse_repairs(harness.files.get(REPAIRS_FILE))
    except BaseException as exc:  # noqa: BLE001 - reported to the host
        error = f"harness code failed to load: {traceback.format_exception_only(exc)[-1].strip()}"
        _send(channel or out, LoadFailed(error=error[:4000]))
        return 1
    _warm_up()
    with contextlib.suppress(OSError):  # a fresh process (--once) already leads its own session
        os.setsid()  # an autogroup of its own: the start-up of later workers is not billed to this one (see _settle)
    _send(channel or out, Ready(isolation=isolation))
    _settle(inp)
    with open(inp, "rb", buffering=65536, closefd=False) as reader:
        while line := reader.readline(MAX_REQUEST):
            request = LayerRequest.validate_json(line)  # the host's: trusted, not bound by the reply's size limit
            _send(channel or out, _answer(request, realize, regulate, repairs))
    return 0


def _warm_up() -> None:
    """Run the library's request and reply paths once on sample messages (no harness code), so that the real
    request does not pay for the first touch of the template's memory (copy-on-write faults)."""
    from .messages import (
        ActionRecord,
        CallRecord,
        LayerReply,
        LayerRequest,
        Realized,
        RealizeRequest,
        RegulateRequest,
        StateRecord,
        VerdictRecord,
        Verdicts,
    )

    action = ActionRecord(tool="t", arguments={"a": 1})
    samples = [RealizeRequest(id="w", text="t", calls=[CallRecord(name="t")], turn=0, task="", tools=[]),
               RegulateRequest(id="w", states=[StateRecord(turn=0, max_turns=1, action=action, observation="",
                                                           history=[(action, "o")])])]
    for sample in samples:
        LayerRequest.validate_json(sample.model_dump_json())
    for reply in (Realized(id="w", text="", actions=[action]), Verdicts(id="w", verdicts=[VerdictRecord()])):
        LayerReply.validate_json(reply.model_dump_json())


def _settle(inp: int) -> None:
    """Wait for the request in a few short sleeps first. A child fresh from its start-up has used more than its
    share of the CPU for a moment, and the kernel's scheduler (EEVDF) serves it last at its next wake-up: on a
    loaded machine that cost 2-8 ms per request. After a few short sleeps it wakes like any idle process
    (0.3 ms). A request that arrives meanwhile is read at once."""
    for _ in range(SETTLE_ROUNDS):
        if select.select([inp], [], [], SETTLE_S)[0]:
            return


def _private_stdio(stderr: int, keep: int) -> None:
    """fds 1 and 2 to this worker's stderr, everything else the template held closed (but `keep`)."""
    os.dup2(stderr, 1)
    os.dup2(stderr, 2)
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    sys.stdout = sys.stderr


def _worker_child(channel: int, stderr: int, root: Path, limits: dict[str, Any],
                   harness: HarnessVersion | None) -> None:
    """The forked child: the worker in fresh namespaces (PID 1 of its own: killing this process ends them)."""
    from ..sandbox import nested

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    def body() -> int:
        _private_stdio(stderr, channel)
        return serve_requests(channel, channel, root, limits, "bwrap+worker-ns", harness)

    try:
        nested.run_sealed(body)
    except BaseException:  # noqa: BLE001
        with contextlib.suppress(OSError):
            os.write(stderr, f"worker setup failed in the template's child:\n{traceback.format_exc()}".encode())
    os._exit(0)


def _once(root: Path, limits: dict[str, Any], confined: str) -> int:
    out = os.dup(1)  # the channel; harness code's prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    code = serve_requests(0, out, root, limits, confined)
    os._exit(code)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--once":
        return _once(Path(argv[1]), json.loads(argv[2]), argv[3] if len(argv) > 3 else "")
    from ..sandbox import nested
    from ..sandbox.zygote import serve_forks, take_control

    root, limits = Path(argv[0]), json.loads(argv[1])
    control = take_control(PRELOAD)
    from ..harness.manifest import load_harness
    with contextlib.suppress(OSError):
        preload_imports(root)
    harness = None
    with contextlib.suppress(Exception):  # a harness that does not load is reported by each child
        harness = load_harness(root)
    return serve_forks(control, nested.works_here(),
                       lambda channel, stderr: _worker_child(channel, stderr, root, limits, harness))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
