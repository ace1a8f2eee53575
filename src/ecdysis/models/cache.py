"""Persistent response cache and the metered client every caller goes through.

The cache is an SQLite file keyed by `cache_key` (model identity, messages, parameters, sample
index), within a scope (a compare arm's training) and a partition (an evaluation's split). Hits cost
no model time and are counted; every reply carries the charged seconds of the call as it ran (`charge.py`: the
cache keeps the original usage and latency). `MeteredModel` adds caching and accounting to any `ChatModel`; it
is what the runner and the optimizer roles hold.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .base import ChatModel, ChatRequest, ChatResponse, cache_key
from .charge import rates


def default_cache_path() -> Path:
    env = os.environ.get("ECDYSIS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ecdysis" / "responses.sqlite"


class CacheError(ValueError):
    """The response cache file cannot be opened (not a database, not writable); the message says what to do."""


class ResponseCache:
    """SQLite-backed map from request hash to response JSON. Safe to share between runs."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, "
                "response TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._db.commit()
        except (OSError, sqlite3.DatabaseError) as exc:
            raise CacheError(f"response cache {self.path} cannot be used ({exc}); move it away, point "
                                   "cache.path (or $ECDYSIS_CACHE) elsewhere, or set cache.enabled = false") from None

    def get(self, key: str) -> ChatResponse | None:
        with self._lock:
            row = self._db.execute("SELECT response FROM responses WHERE key=?", (key,)).fetchone()
        return ChatResponse.model_validate_json(row[0]) if row else None

    def put(self, key: str, response: ChatResponse) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?,?,?,?)",
                (key, response.model_id, response.model_dump_json(), time.time()),
            )
            self._db.commit()

    def add_missing(self, rows: list[tuple[str, str, str, float]]) -> int:
        """Add (key, model, response JSON, created) rows whose key the cache lacks, in one transaction (none
        replaced); returns how many were added."""
        with self._lock, self._db:
            before = self._db.total_changes
            self._db.executemany("INSERT OR IGNORE INTO responses VALUES (?,?,?,?)", rows)
            return self._db.total_changes - before

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()


@dataclass
class CallStats:
    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_time_s: float = 0.0
    cost_usd: float = 0.0

    def add(self, response: ChatResponse) -> None:
        self.calls += 1
        if response.cache_hit:
            self.cache_hits += 1
            return
        self.prompt_tokens += response.usage.prompt_tokens
        self.completion_tokens += response.usage.completion_tokens
        self.model_time_s += response.latency_s
        self.cost_usd += response.cost_usd


CallListener = Callable[[str, ChatRequest, ChatResponse], None]


@dataclass
class MeteredModel:
    """A `ChatModel` with an optional persistent cache, per-role accounting and call listeners."""

    model: ChatModel
    cache: ResponseCache | None = None
    role: str = "agent"
    scope: str = ""  # a non-empty scope reads and writes only cache entries of that scope
    stats: CallStats = field(default_factory=CallStats)
    listeners: list[CallListener] = field(default_factory=list)
    read_scopes: tuple[str, ...] = ()  # scopes also read on a miss (a compare seed's shared seed evaluation)
    _inflight: dict[str, asyncio.Future[ChatResponse]] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return self.model.identity

    def release(self, session: str) -> None:
        """Tell the backend an episode ended (backends that keep per-episode state free it)."""
        release = getattr(self.model, "release", None)
        if release is not None:
            release(session)

    def cache_identity(self, partition: str = "", scope: str | None = None) -> str:
        """What a request's cache key is taken under: the model, the scope (default this client's) and the
        partition, if any."""
        scope = self.scope if scope is None else scope
        identity = f"{self.model.identity}\0scope={scope}" if scope else self.model.identity
        return f"{identity}\0partition={partition}" if partition else identity

    def request_key(self, request: ChatRequest, partition: str = "") -> str:
        """The request's scope-free key, what a run pays once (store.charged_calls); "" without a cache."""
        return cache_key(self.cache_identity(partition, ""), request) if self.cache is not None else ""

    async def chat(self, request: ChatRequest, partition: str = "") -> ChatResponse:
        """The response, from the cache where an identical request of the same scope (or one of `read_scopes`)
        and `partition` was answered before. Evaluations pass their split as the partition: no entry written
        while one split is evaluated is ever read while another is, so cache hits (and their timing) carry
        nothing between splits. `charged_s` is what the call cost when it ran (charge.py), whichever way it is
        served now; `request_key` names the request without the scope (what a run pays once, store.charged_calls)."""
        key = cache_key(self.cache_identity(partition), request)
        charge = {"request_key": self.request_key(request, partition)}
        response = self.cache.get(key) if self.cache is not None else None
        for scope in self.read_scopes if self.cache is not None and response is None else ():
            if (response := self.cache.get(cache_key(self.cache_identity(partition, scope), request))) is not None:
                break
        if response is not None:
            response = response.model_copy(update={"cache_hit": True, "latency_s": 0.0, "cost_usd": 0.0,
                                                    "retries": 0, "charged_s": rates().call_seconds(response),
                                                    **charge})
        elif key in self._inflight:  # an identical call is running: share its result
            try:
                shared = await asyncio.shield(self._inflight[key])
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():  # this caller was cancelled
                    raise
                return await self.chat(request, partition)  # the call it waited for was: make it again
            response = shared.model_copy(update={"cache_hit": True, "latency_s": 0.0, "cost_usd": 0.0,
                                                  "retries": 0})
        else:
            future: asyncio.Future[ChatResponse] = asyncio.get_running_loop().create_future()
            self._inflight[key] = future
            try:
                response = await self.model.chat(request)
                response = response.model_copy(update={"charged_s": rates().call_seconds(response), **charge})
                future.set_result(response)
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # mark retrieved
                raise
            finally:
                del self._inflight[key]
        self.stats.add(response)
        for listener in self.listeners:  # accounted before cached: a kill in between re-pays (and counts) the
            listener(self.role, request, response)  # call on resume instead of serving it uncounted
        if self.cache is not None and not response.cache_hit:
            self.cache.put(key, response)
        return response
