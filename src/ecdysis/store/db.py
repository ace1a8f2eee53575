"""The run store: one SQLite database (WAL) per run directory, written as results arrive.

It is the source of truth: runs, harness versions, evaluations, trajectories, model calls, and
the trainer's records (patterns, transcripts, specs, decisions, timings) as typed JSON rows.
Reports are views of it. Every write commits, so a killed process loses at most the row in flight.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..agent.trajectory import Trajectory
from ..harness.manifest import HarnessVersion, version_from_files

DB_NAME = "ecdysis.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, created REAL NOT NULL, status TEXT NOT NULL,
  config TEXT NOT NULL, summary TEXT);
CREATE TABLE IF NOT EXISTS harness_versions (
  id TEXT PRIMARY KEY, name TEXT, files TEXT NOT NULL, parent TEXT, note TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
  id TEXT PRIMARY KEY, run_id TEXT NOT NULL, harness_id TEXT NOT NULL, model TEXT NOT NULL,
  env TEXT NOT NULL, split TEXT NOT NULL, trials INTEGER NOT NULL, n_tasks INTEGER NOT NULL,
  label TEXT, created REAL NOT NULL, finished REAL, summary TEXT);
CREATE TABLE IF NOT EXISTS trajectories (
  eval_id TEXT NOT NULL, task_id TEXT NOT NULL, trial INTEGER NOT NULL, score REAL NOT NULL,
  passed INTEGER NOT NULL, termination TEXT NOT NULL, wall_s REAL, model_time_s REAL,
  tokens INTEGER, data TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (eval_id, task_id, trial));
CREATE TABLE IF NOT EXISTS model_calls (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, eval_id TEXT, role TEXT, model TEXT,
  prompt_tokens INTEGER, completion_tokens INTEGER, latency_s REAL, cost_usd REAL,
  cache_hit INTEGER, created REAL NOT NULL, cached_tokens INTEGER DEFAULT 0, charged_s REAL DEFAULT 0,
  call_key TEXT DEFAULT '', constrained_tokens INTEGER);
CREATE TABLE IF NOT EXISTS records (
  run_id TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL,
  created REAL NOT NULL, PRIMARY KEY (run_id, kind, key));
"""


LOCK_NAME = ".ecdysis.lock"
_CLAIMS: dict[str, IO[str]] = {}  # run dirs this process holds (claims are per process, not per store)


@dataclass(frozen=True)
class FreshCall:
    """One model call served fresh: its tokens and its measured latency. `constrained_tokens` is None in a
    store written before the grammar flag was recorded."""

    role: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    constrained_tokens: int | None
    latency_s: float


class RunDirBusy(RuntimeError):
    """Another process is writing to this run directory."""


class StoreError(ValueError):
    """A run directory or its database that cannot be used (a file where a folder should be, a file that is not
    a SQLite database); the message names the path and what to do."""


class AmbiguousRunId(ValueError):
    """A run-id prefix that more than one run starts with; the message lists them."""


# Runs this process started and has not finished: (database path, run id). On Ctrl-C, SIGTERM or an error the
# command line marks them (`mark_open_runs`), so none stays `running` after its process is gone.
_OPEN_RUNS: dict[tuple[Path, str], None] = {}


def mark_open_runs(status: str) -> list[str]:
    """Set `status` (`interrupted`, `failed`) on every run this process started and did not finish, through a
    connection of its own (the store's may be mid-call); returns their ids. Resuming a run sets it back to
    `running`."""
    marked = []
    for path, run_id in list(_OPEN_RUNS):
        try:
            with sqlite3.connect(path, timeout=5) as db:
                db.execute("UPDATE runs SET status=? WHERE id=? AND status='running'", (status, run_id))
            db.close()
            marked.append(run_id)
        except sqlite3.Error:
            pass  # the database went away or is locked: nothing more to do on the way out
        _OPEN_RUNS.pop((path, run_id), None)
    return marked


def claim_run_dir(run_dir: Path) -> None:
    """Take the run directory for this process (an exclusive `flock`, released when the process ends,
    even on SIGKILL). A second process gets RunDirBusy naming the holder's pid."""
    key = str(run_dir.resolve())
    if key in _CLAIMS:
        return
    handle = open(run_dir / LOCK_NAME, "a+")  # noqa: SIM115 - held open for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirBusy(f"run directory {run_dir} is in use by {holder}; wait for it to finish (or stop it), "
                         "or use another --run-dir. Reading it (`runs list`, `show`) is fine.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    _CLAIMS[key] = handle


class RunStore:
    """Thread-safe access to one run directory's database."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(f"run directory {self.run_dir} is a file, not a folder; pass a folder as --run-dir "
                             "(it is created if missing)") from None
        except PermissionError:
            raise StoreError(f"run directory {self.run_dir} cannot be created here (permission denied); "
                             "pass a folder you can write to as --run-dir") from None
        self.path = self.run_dir / DB_NAME
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            columns = {r["name"] for r in self._db.execute("PRAGMA table_info(model_calls)")}
            if "cached_tokens" not in columns:  # a store written before prompt-cache accounting
                self._db.execute("ALTER TABLE model_calls ADD COLUMN cached_tokens INTEGER DEFAULT 0")
            if "charged_s" not in columns:  # a store written before charged time
                self._db.execute("ALTER TABLE model_calls ADD COLUMN charged_s REAL DEFAULT 0")
                self._db.execute("ALTER TABLE model_calls ADD COLUMN call_key TEXT DEFAULT ''")
            if "constrained_tokens" not in columns:  # a store written before the grammar flag: NULL, unknown
                self._db.execute("ALTER TABLE model_calls ADD COLUMN constrained_tokens INTEGER")
            self._db.execute("CREATE INDEX IF NOT EXISTS model_calls_eval ON model_calls (eval_id)")
            self._db.execute("CREATE INDEX IF NOT EXISTS model_calls_run ON model_calls (run_id)")
            self._db.commit()
        except sqlite3.DatabaseError as exc:  # OperationalError (unreadable, a folder) included
            raise StoreError(f"{self.path} is not a usable run database ({exc}); move it away or pass another "
                             "--run-dir") from None

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)
            self._db.commit()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        self._db.close()

    # runs
    def start_run(self, kind: str, config: dict[str, Any], run_id: str | None = None) -> str:
        """Create a run, or reopen `run_id` if it exists (resume)."""
        run_id = run_id or f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        existing = self._rows("SELECT id FROM runs WHERE id=?", (run_id,))
        if existing:
            self._write("UPDATE runs SET status='running' WHERE id=?", (run_id,))
        else:
            self._write("INSERT INTO runs VALUES (?,?,?,?,?,NULL)",
                        (run_id, kind, time.time(), "running", json.dumps(config, default=str)))
        _OPEN_RUNS[(self.path.resolve(), run_id)] = None
        return run_id

    def finish_run(self, run_id: str, summary: dict[str, Any], status: str = "finished") -> None:
        self._write("UPDATE runs SET status=?, summary=? WHERE id=?",
                    (status, json.dumps(summary, default=str), run_id))
        _OPEN_RUNS.pop((self.path.resolve(), run_id), None)

    def runs(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows("SELECT * FROM runs ORDER BY created")]

    def runs_matching(self, prefix: str) -> list[dict[str, Any]]:
        """The run whose id is `prefix`, else every run whose id starts with it (oldest first)."""
        exact = self._rows("SELECT * FROM runs WHERE id=?", (prefix,))
        rows = exact or self._rows("SELECT * FROM runs WHERE substr(id, 1, ?) = ? ORDER BY created",
                                   (len(prefix), prefix))
        return [dict(r) for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The run with this id or unique id prefix; None if there is none, AmbiguousRunId if several match."""
        rows = self.runs_matching(run_id) if run_id else []
        if len(rows) > 1:
            raise AmbiguousRunId(f"run id prefix {run_id!r} matches {len(rows)} runs in {self.run_dir}: "
                                 f"{', '.join(r['id'] for r in rows)}; give more of the id")
        return rows[0] if rows else None

    # harness versions
    def save_version(self, version: HarnessVersion, parent: str | None = None, note: str = "") -> str:
        self._write("INSERT OR IGNORE INTO harness_versions VALUES (?,?,?,?,?,?)",
                    (version.id, version.manifest.name, version.to_json(), parent, note, time.time()))
        return version.id

    def load_version(self, version_id: str) -> HarnessVersion:
        rows = self._rows("SELECT files FROM harness_versions WHERE id=?", (version_id,))
        if not rows:
            raise KeyError(f"no harness version {version_id} in {self.path}")
        return version_from_files(json.loads(rows[0]["files"]), origin=f"version {version_id}")

    def versions(self) -> list[dict[str, Any]]:
        """Every harness version stored (id, name, parent, note, created), oldest first; files excluded."""
        return [dict(r) for r in self._rows(
            "SELECT id, name, parent, note, created FROM harness_versions ORDER BY created")]

    def find_version(self, prefix: str) -> HarnessVersion:
        """The version whose id is `prefix` or starts with it; KeyError naming the candidates otherwise."""
        ids = [v["id"] for v in self.versions() if v["id"].startswith(prefix)]
        if len(ids) != 1:
            raise KeyError(f"{'no' if not ids else 'more than one'} harness version matches {prefix!r} in "
                           f"{self.path}{': ' + ', '.join(ids) if ids else ''}")
        return self.load_version(ids[0])

    # evaluations and trajectories
    def open_evaluation(self, eval_id: str, run_id: str, harness_id: str, model: str, env: str,
                        split: str, trials: int, n_tasks: int, label: str) -> None:
        self._write("INSERT OR IGNORE INTO evaluations VALUES (?,?,?,?,?,?,?,?,?,?,NULL,NULL)",
                    (eval_id, run_id, harness_id, model, env, split, trials, n_tasks, label, time.time()))

    def finish_evaluation(self, eval_id: str, summary: dict[str, Any]) -> None:
        self._write("UPDATE evaluations SET finished=?, summary=? WHERE id=?",
                    (time.time(), json.dumps(summary), eval_id))

    def evaluations(self, run_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows("SELECT * FROM evaluations WHERE run_id=? ORDER BY created", (run_id,))]

    def record_trajectory(self, eval_id: str, traj: Trajectory) -> None:
        self._write(
            "INSERT OR REPLACE INTO trajectories VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (eval_id, traj.task_id, traj.trial, traj.score, int(traj.passed), traj.termination,
             traj.wall_s, traj.model_time_s, traj.prompt_tokens + traj.completion_tokens,
             json.dumps(traj.to_dict()), time.time()),
        )

    def done_keys(self, eval_id: str) -> set[tuple[str, int]]:
        """(task, trial) pairs finished for good (episodes the infrastructure lost are run again)."""
        rows = self._rows("SELECT task_id, trial FROM trajectories WHERE eval_id=? AND termination != 'infra_error'",
                          (eval_id,))
        return {(r["task_id"], r["trial"]) for r in rows}

    def episode_count(self, eval_ids: list[str]) -> int:
        """Episodes recorded in these evaluations, those the infrastructure lost left out."""
        if not eval_ids:
            return 0
        marks = ",".join("?" * len(eval_ids))
        rows = self._rows(f"SELECT COUNT(*) AS n FROM trajectories WHERE eval_id IN ({marks}) "
                          "AND termination != 'infra_error'", tuple(eval_ids))
        return int(rows[0]["n"])

    def trajectories(self, eval_id: str) -> list[Trajectory]:
        rows = self._rows("SELECT data FROM trajectories WHERE eval_id=? ORDER BY task_id, trial", (eval_id,))
        return [Trajectory.from_dict(json.loads(r["data"])) for r in rows]

    # model calls
    def record_call(self, run_id: str | None, eval_id: str | None, role: str, model: str,
                    prompt_tokens: int, completion_tokens: int, latency_s: float, cost_usd: float,
                    cache_hit: bool, cached_tokens: int = 0, charged_s: float = 0.0, call_key: str = "",
                    constrained_tokens: int = 0) -> None:
        """One model call. `cached_tokens`: prompt tokens the backend served from its prefix cache; `charged_s`:
        what the call costs (models/charge.py); `call_key`: the request's scope-free key ("": always paid);
        `constrained_tokens`: completion tokens generated under a grammar (a JSON schema or a forced call)."""
        self._write("INSERT INTO model_calls (run_id, eval_id, role, model, prompt_tokens, completion_tokens, "
                    "latency_s, cost_usd, cache_hit, created, cached_tokens, charged_s, call_key, "
                    "constrained_tokens) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, eval_id, role, model, prompt_tokens, completion_tokens, latency_s,
                     cost_usd, int(cache_hit), time.time(), cached_tokens, charged_s, call_key,
                     constrained_tokens))

    def paid_role_call(self, run_id: str, call_key: str) -> bool:
        """Whether the run already made (and paid) this optimizer-role request: asked again, it is free
        (`charged_calls` pays each request once). False for an unkeyed request ("": always paid)."""
        return bool(call_key) and bool(self._rows(
            "SELECT 1 FROM model_calls WHERE run_id=? AND eval_id IS NULL AND call_key=? LIMIT 1", (run_id, call_key)))

    def fresh_calls(self) -> list[FreshCall]:
        """The calls a backend served fresh (not from the response cache) with a measured latency, oldest first:
        what a rate table is checked against."""
        rows = self._rows("SELECT role, model, prompt_tokens, cached_tokens, completion_tokens, constrained_tokens, "
                          "latency_s FROM model_calls WHERE cache_hit = 0 AND latency_s > 0 ORDER BY id")
        return [FreshCall(r["role"], r["model"], r["prompt_tokens"], r["cached_tokens"] or 0, r["completion_tokens"],
                          r["constrained_tokens"], r["latency_s"]) for r in rows]

    def charged_calls(self, run_id: str, eval_ids: list[str]) -> float:
        """Charged seconds of a run's model calls: its calls outside evaluations (optimizer roles) and the calls
        of `eval_ids`, each distinct request paid once (a repeat is what a cold run serves from its cache)."""
        return sum(s for s, _ in self.paid_calls_by_role(run_id, eval_ids).values())

    def paid_calls_by_role(self, run_id: str, eval_ids: list[str]) -> dict[str, tuple[float, int]]:
        """Per role (agent, user, analyst, ...), the charged seconds and the tokens (prompt + completion) of the
        calls `charged_calls` pays: what a cold run of this run alone would spend, whatever its cache served."""
        marks = ",".join("?" * len(eval_ids))
        where = f"((run_id=? AND eval_id IS NULL){f' OR eval_id IN ({marks})' if eval_ids else ''})"
        rows = self._rows(
            f"SELECT r, COALESCE(SUM(c), 0) AS s, COALESCE(SUM(t), 0) AS t FROM (SELECT MAX(role) AS r, "
            f"MAX(charged_s) AS c, MAX(prompt_tokens + completion_tokens) AS t FROM model_calls WHERE {where} "
            f"AND call_key != '' GROUP BY call_key UNION ALL SELECT role AS r, charged_s AS c, "
            f"prompt_tokens + completion_tokens AS t FROM model_calls WHERE {where} AND (call_key = '' OR "
            "call_key IS NULL)) GROUP BY r ORDER BY r", (run_id, *eval_ids, run_id, *eval_ids))
        return {str(row["r"]): (float(row["s"] or 0.0), int(row["t"] or 0)) for row in rows}

    def call_totals(self, run_id: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows(
            "SELECT role, COUNT(*) AS calls, SUM(cache_hit) AS cache_hits, "
            "SUM(CASE WHEN cache_hit THEN 0 ELSE prompt_tokens END) AS prompt_tokens, "
            "SUM(CASE WHEN cache_hit THEN 0 ELSE completion_tokens END) AS completion_tokens, "
            "SUM(CASE WHEN cache_hit THEN 0 ELSE cached_tokens END) AS cached_tokens, "
            "SUM(latency_s) AS model_time_s, SUM(cost_usd) AS cost_usd "
            "FROM model_calls WHERE run_id=? GROUP BY role ORDER BY role", (run_id,))]

    # trainer records: patterns, transcripts, specs, decisions, timings
    def put_record(self, run_id: str, kind: str, key: str, data: Any) -> None:
        self._write("INSERT OR REPLACE INTO records VALUES (?,?,?,?,?)",
                    (run_id, kind, key, json.dumps(data, default=str), time.time()))

    def get_record(self, run_id: str, kind: str, key: str) -> Any | None:
        rows = self._rows("SELECT data FROM records WHERE run_id=? AND kind=? AND key=?", (run_id, kind, key))
        return json.loads(rows[0]["data"]) if rows else None

    def count_records(self, run_id: str, kind: str) -> int:
        return int(self._rows("SELECT COUNT(*) AS n FROM records WHERE run_id=? AND kind=?", (run_id, kind))[0]["n"])

    def records(self, run_id: str, kind: str) -> list[tuple[str, Any]]:
        rows = self._rows("SELECT key, data FROM records WHERE run_id=? AND kind=? ORDER BY created", (run_id, kind))
        return [(r["key"], json.loads(r["data"])) for r in rows]
