"""Embedded llama.cpp backend: runs a GGUF in-process (needs the `local` extra).

Each model file is loaded once per (context size, instance) and shared; one generation runs at a time in the
process, every one on the backend's one llama.cpp thread (`_COMPUTE`: one OpenMP team; 2 cores gain nothing from
more). Episodes (request `session`) share a loaded context:
when another episode's turn comes, the current episode's KV cache (sequence 0 only, no logits) is
saved and the next episode's restored (`SessionStates`, up to `slots` kept), so concurrent multi-turn
episodes do not evict each other: each turn processes only its new tokens. A new episode starts from
whatever the context holds, so the prefix all episodes share (contract, tools, demos) is reused, not
processed again. The chat template comes from the GGUF metadata; JSON-schema output uses llama.cpp's
grammar support. A call whose caller stops waiting (its task cancelled, e.g. by Ctrl-C) stops at llama.cpp's
next step (`GenerationCancelled`), so an interrupted command exits without waiting for the generation to end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import ChatRequest, ChatResponse, ModelConfigError, ModelError, Usage
from .local_models import CATALOG, resolve_verified, sha256_file
from .toolcalls import for_template, forced_call_schema, parse_reply_calls, tool_names_of, under_grammar


@dataclass
class Loaded:
    """A loaded model: one llama.cpp context, the lock that lets one generation run on it at a time, and
    its episodes' saved KV states."""

    llm: Any
    lock: threading.Lock
    states: SessionStates


_LOADED: dict[tuple[str, int, str], Loaded] = {}
_LOAD_LOCK = threading.Lock()


# llama.cpp's OpenMP threads meet at a barrier after every operation of every token. Spinning there without
# end (libgomp's default and ACTIVE) collapses on a shared machine: a spinning thread holds the core its
# partner needs (2 threads, 2 cores, one busy process beside: 1.1 tok/s vs 8.8 passive). Sleeping at once
# (PASSIVE) costs an idle machine 1.35x per generated token. So: passive, but spin 3000 rounds first (libgomp's
# GOMP_SPINCOUNT wins over the policy): AVX-512 build, idle 15.9 tok/s, one busy process 7.2 (passive 8.8)
# (Qwen2.5-Coder-1.5B, docs/setup.md). Read by the OpenMP runtime when llama_cpp loads. A user who sets
# OMP_WAIT_POLICY or GOMP_SPINCOUNT gets exactly that.
OMP_WAIT_POLICY = "PASSIVE"
GOMP_SPINCOUNT = "3000"


# libgomp keeps one thread team per calling thread. Generations sent from asyncio's pool of threads (a different
# one from call to call) each got a team of their own; once a process holds more OpenMP threads than CPUs,
# libgomp cuts every team's spinning to its short "throttled" count (libgomp env.c), i.e. passive speed: 58 ->
# 83 ms per generated token from the third call on (Qwen2.5-Coder-1.5B, 2 cores; tests/test_local_backends.py
# `test_every_generation_runs_on_one_thread`). So every llama.cpp generation runs on this one thread.
_COMPUTE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama.cpp")


def openmp_defaults() -> None:
    """Set the OpenMP wait defaults above in this process's environment; call before importing llama_cpp."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


def _import_llama() -> Any:
    openmp_defaults()
    try:
        import llama_cpp
    except ImportError as exc:
        raise ModelConfigError(
            "the embedded backend needs llama-cpp-python: `pip install 'ecdysis[local]'` "
            "(or run `make setup`)"
        ) from exc
    return llama_cpp


def _close_all() -> None:
    """Free loaded models before interpreter teardown (llama-cpp-python's finalizers fail after it)."""
    for loaded in _LOADED.values():
        with contextlib.suppress(Exception):
            loaded.llm.close()
    _LOADED.clear()


atexit.register(_close_all)


class GenerationCancelled(Exception):
    """The caller stopped waiting (its task was cancelled, e.g. by Ctrl-C): the generation stopped early."""


@functools.cache
def _cancellable_llama(llama_cpp: Any) -> type:
    """`llama_cpp.Llama` whose work stops at its next step once `cancel` (a threading.Event) is set.

    Every token llama.cpp processes goes through `Llama.eval`: the prompt in `n_batch` chunks, then one call per
    generated token. Checking the event before each chunk stops a cancelled call within one chunk (a few
    seconds of prompt, one token of generation) instead of running it to the end while the interrupted command
    waits at exit for the llama.cpp thread. The chunks are the ones `Llama.eval` makes itself, so what is
    computed, and the context's tokens after it, are the same."""
    class CancellableLlama(llama_cpp.Llama):  # type: ignore[misc,name-defined]
        cancel: threading.Event | None = None

        def eval(self, tokens: Any) -> None:
            if len(tokens) == 0:
                return super().eval(tokens)  # exactly the base call (it clears the cache past n_tokens)
            for i in range(0, len(tokens), self.n_batch):
                if self.cancel is not None and self.cancel.is_set():
                    raise GenerationCancelled(f"cancelled after {self.n_tokens} tokens in the context")
                super().eval(tokens[i: i + self.n_batch])

    return CancellableLlama


def _key(path: Path, n_ctx: int, instance: str) -> tuple[str, int, str]:
    return str(path.resolve()), n_ctx, instance


def load(path: Path, n_ctx: int = 4096, n_threads: int | None = None, instance: str = "") -> Loaded:
    """The process-wide model for (`path`, `n_ctx`, `instance`), loaded on first use."""
    key = _key(path, n_ctx, instance)
    with _LOAD_LOCK:
        if key not in _LOADED:
            llama_cpp = _import_llama()
            llm = _cancellable_llama(llama_cpp)(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads or os.cpu_count() or 1,
                verbose=False,
            )
            _LOADED[key] = Loaded(llm, threading.Lock(), SessionStates(0))
        return _LOADED[key]


def load_llama(path: Path, n_ctx: int = 4096, n_threads: int | None = None,
               instance: str = "") -> tuple[Any, threading.Lock]:
    """The process-wide Llama for (`path`, `n_ctx`, `instance`) (loaded on first use) and its lock."""
    loaded = load(path, n_ctx, n_threads, instance)
    return loaded.llm, loaded.lock


class SessionStates:
    """Per-episode KV state on one llama.cpp context: swap out the running episode's sequence, swap in the
    next one's. Holds at most `keep` saved episodes besides the one in the context (least recently used
    dropped: that episode's next turn reprocesses its conversation); `keep` 0 saves nothing."""

    def __init__(self, keep: int) -> None:
        self.keep = max(0, keep)
        self.current: str | None = None
        self.saved: OrderedDict[str, tuple[bytes, Any]] = OrderedDict()  # session -> (KV bytes, token ids)

    def switch(self, llm: Any, session: str) -> None:
        """Make `session`'s tokens the context's (call under the model's lock)."""
        if not session or session == self.current:
            return
        llama_cpp = _import_llama()
        ctx = llm._ctx.ctx
        incoming = self.saved.pop(session, None)  # taken first, so saving the outgoing one cannot evict it
        if self.current is not None and llm.n_tokens > 0 and self.keep > 0:
            size = llama_cpp.llama_state_seq_get_size(ctx, 0)
            buffer = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)
            self.saved[self.current] = (bytes(buffer)[:written], llm.input_ids[: llm.n_tokens].copy())
            while len(self.saved) > self.keep:
                self.saved.popitem(last=False)
        self.current = session
        if incoming is None:
            return  # a new episode: keep what the context holds, so the shared prompt prefix is reused
        data, ids = incoming
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
        restored = llama_cpp.llama_state_seq_set_data(ctx, (ctypes.c_uint8 * len(data)).from_buffer_copy(data),
                                                     len(data), 0)
        if restored != len(data):  # could not restore: start from an empty context (correct, only slower)
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, -1, -1)
            llm.n_tokens = 0
            return
        llm.input_ids[: len(ids)] = ids
        llm.n_tokens = len(ids)
        llm._requires_eval = True  # the logits are another episode's: never sample from them (an exact-prompt hit)

    def release(self, session: str) -> None:
        self.saved.pop(session, None)
        if self.current == session:
            self.current = None  # its tokens stay in the context for the next episode's prefix


def reused_prefix(before: list[int], prompt: list[int]) -> int:
    """Prompt tokens llama.cpp does not process again: the common prefix with the context's tokens
    (it always evaluates the prompt's last token, as llama-cpp-python's `generate` does)."""
    n = 0
    for a, b in zip(before, prompt[:-1], strict=False):
        if a != b:
            break
        n += 1
    return n


class LlamaCppModel:
    """A GGUF model run in this process. `name` is a catalog name or a path to a .gguf file."""

    def __init__(self, name: str, n_ctx: int = 4096, n_threads: int | None = None, instance: str = "",
                 slots: int = 1) -> None:
        if name in CATALOG:
            self.path = resolve_verified(name)
            self._digest = CATALOG[name].sha256
        else:
            path = Path(name).expanduser()
            if path.suffix != ".gguf" or not path.exists():
                known = ", ".join(sorted(CATALOG))
                raise ModelConfigError(
                    f"local model {name!r} is neither a catalog name ({known}) nor an existing .gguf file"
                )
            self.path = path
            self._digest = sha256_file(path)
        self.name = name
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.instance = instance
        self.slots = max(1, slots)

    @property
    def identity(self) -> str:
        return f"llama.cpp:{self._digest}"

    def _loaded(self) -> Loaded | None:
        """This model's process-wide instance, if it is loaded yet (never loads it)."""
        return _LOADED.get(_key(self.path, self.n_ctx, self.instance))

    def release(self, session: str) -> None:
        """The episode `session` has ended: drop its saved state (a model not loaded yet has none)."""
        loaded = self._loaded()
        if loaded is None:
            return
        with loaded.lock:
            loaded.states.release(session)

    def _generate(self, request: ChatRequest, forced: dict[str, Any] | None,
                  cancel: threading.Event | None = None) -> tuple[dict[str, Any], float, int]:
        """Generate under the model's lock; returns the completion, the generation time only, and the
        prompt tokens llama.cpp reused from the context's KV cache (its longest common prefix). Once `cancel`
        is set, raises GenerationCancelled at llama.cpp's next step (before any if it is set already)."""
        loaded = load(self.path, self.n_ctx, self.n_threads, self.instance)
        llm = loaded.llm
        p = request.params
        kwargs: dict[str, Any] = {
            "messages": for_template(request.messages),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        if p.stop:
            kwargs["stop"] = p.stop
        kwargs["seed"] = p.call_seed  # every call, so a resumed or partly cached run samples as the cold one
        if p.json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": p.json_schema}
        if forced is not None:  # a call is required: the schema of one call, grammar-constrained
            kwargs["response_format"] = {"type": "json_object", "schema": forced}
        if p.tools:
            kwargs["tools"] = p.tools  # rendered by the GGUF's own chat template (Qwen2.5 has a tools section)
        with loaded.lock:  # one generation at a time on this context (and on this machine's cores)
            loaded.states.keep = max(loaded.states.keep, self.slots - 1)  # backends sharing it: the largest
            loaded.states.switch(llm, p.session)
            before = list(llm._input_ids)  # the tokens whose KV the context holds
            start = time.perf_counter()
            llm.cancel = cancel
            try:
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelled("cancelled before it started")
                out = llm.create_chat_completion(**kwargs)
            finally:
                llm.cancel = None
            seconds = time.perf_counter() - start
            prompt = list(llm._input_ids)[: (out.get("usage") or {}).get("prompt_tokens", 0)]
            return out, seconds, reused_prefix(before, prompt)

    def failure(self, exc: ValueError, request: ChatRequest) -> str:
        """A failed call's message. A prompt that does not fit the context window (llama-cpp-python refuses a
        prompt of `n_ctx` tokens or more, and cuts the reply to what is left) names the window that would fit
        it with the reply's `max_tokens`, within what the model was trained on, or says that none would."""
        if "context window" not in str(exc):
            return f"{self.name}: {exc}"
        loaded = self._loaded()
        trained = loaded.llm._model.n_ctx_train() if loaded is not None else 0
        found = re.search(r"Requested tokens \((\d+)\)", str(exc))
        needed = (int(found.group(1)) if found else self.n_ctx) + request.params.max_tokens
        fits = next((n for n in (2 ** k for k in range(9, 21)) if n >= needed), needed)
        if trained and fits > trained:
            fix = (f"the model was trained on {trained} tokens, so no window fits this prompt and its reply: use "
                   "a model with a longer context")
        else:
            fix = (f"give it a larger window, e.g. --set 'model_settings.\"local:{self.name}\".n_ctx={fits}'"
                   + (f" (it was trained on {trained} tokens)" if trained else "") + ", or use a model with a "
                   "longer context")
        return (f"{self.name}: {exc}. The prompt does not fit the model's context window: {fix} (--model for the "
                "agent, --roles-model for the roles); a changed setting starts a new run (it is part of the run id)")

    async def chat(self, request: ChatRequest) -> ChatResponse:
        forced = forced_call_schema(request.params.tools, request.params.tool_choice)
        constrained = under_grammar(request.params)  # a grammar, as _generate sets
        cancel = threading.Event()
        try:
            out, seconds, reused = await asyncio.get_running_loop().run_in_executor(
                _COMPUTE, self._generate, request, forced, cancel)
        except asyncio.CancelledError:  # nobody waits for the reply: stop the generation at its next step
            cancel.set()
            raise
        except ValueError as exc:  # e.g. prompt longer than the context window
            raise ModelError(self.failure(exc, request)) from exc
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        text, calls = choice["message"].get("content") or "", []
        if request.params.tools:
            text, calls = parse_reply_calls(text, forced is not None, tool_names_of(request.params.tools))
        return ChatResponse(
            text=text,
            tool_calls=calls,
            finish_reason=choice.get("finish_reason") or "stop",
            usage=Usage(
                prompt_tokens=usage.get("prompt_tokens", 0),
                completion_tokens=usage.get("completion_tokens", 0),
                cached_tokens=reused,
                constrained_tokens=usage.get("completion_tokens", 0) if constrained else 0,
            ),
            latency_s=seconds,
            cost_usd=0.0,
            model_id=self.identity,
        )
