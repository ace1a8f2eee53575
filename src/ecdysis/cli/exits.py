"""How a command ends: its exit status, Ctrl-C and SIGTERM, and the runs it leaves behind.

    0    done
    1    internal error (a bug): one line, or the traceback with --debug (or ECDYSIS_DEBUG=1)
    2    user error: what is wrong, where (file and line, option, path) and what to do
    130  interrupted by Ctrl-C (SIGINT); 143 by SIGTERM: "interrupted; run the same command to resume"

A run the command started and did not finish is not left `running`: it is marked `interrupted` (a signal) or
`failed` (an error) in its store; running the same command again resumes it (and marks it `running`).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

from rich.markup import escape

from ..store import mark_open_runs
from .common import err_console

_received: list[int] = []  # the signal that stopped the command, if one did
T = TypeVar("T")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM outside an event loop takes Ctrl-C's path (`run_async` handles it inside one)."""
    _received.append(signum)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a background job ignores SIGINT: raise it here
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)


def run_async(command: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(command)` for a CLI command: SIGTERM stops it as asyncio stops one on Ctrl-C. The loop takes the
    signal (never a KeyboardInterrupt raised in whatever frame runs, e.g. a cleanup of a closing loop, when a
    background job's SIGINT is ignored), cancels the command's task once, lets it unwind through its cleanups,
    then raises KeyboardInterrupt for `run_guarded` (exit 143, runs marked interrupted)."""

    async def main() -> T:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        assert task is not None

        def stop() -> None:
            if not _received:  # a repeated SIGTERM does not cut the cleanup the first one started
                _received.append(signal.SIGTERM)
                task.cancel()

        before = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, stop)
        try:
            return await command
        finally:
            loop.remove_signal_handler(signal.SIGTERM)  # leaves SIG_DFL: put back the handler it replaced
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if _received:
            raise KeyboardInterrupt from None
        raise


def _interrupted(exc: BaseException | None) -> bool:
    """Whether `exc` is, or was raised while handling, a KeyboardInterrupt (typer turns one into exit 130)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _say_interrupted() -> int:
    runs = mark_open_runs("interrupted")
    signum = _received[0] if _received else signal.SIGINT
    if runs:
        err_console.print(f"interrupted; run the same command to resume (marked {', '.join(runs)} interrupted)",
                          highlight=False)
    else:
        err_console.print("interrupted", highlight=False)
    return 128 + signum


def run_guarded(command: Callable[[], None], debug: bool) -> None:
    """Run the command line; end the process with the status above (never a traceback unless `debug`)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        command()
    except KeyboardInterrupt:
        sys.exit(_say_interrupted())
    except SystemExit as exc:
        if _interrupted(exc):
            sys.exit(_say_interrupted())
        if exc.code not in (0, None):
            mark_open_runs("failed")
        raise
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a short message, or the traceback
        mark_open_runs("failed")
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (run again with --debug for the traceback)"
        err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}{hint}",
                          highlight=False, markup=True)
        sys.exit(1)
