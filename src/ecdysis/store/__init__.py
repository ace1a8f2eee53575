"""Run store: one SQLite database per run directory."""

from .db import DB_NAME, AmbiguousRunId, RunDirBusy, RunStore, StoreError, claim_run_dir, mark_open_runs

__all__ = ["DB_NAME", "AmbiguousRunId", "RunDirBusy", "RunStore", "StoreError", "claim_run_dir", "mark_open_runs"]
