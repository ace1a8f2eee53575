"""Run store: one SQLite database per run directory."""

from .db import DB_NAME, RunDirBusy, RunStore, claim_run_dir

__all__ = ["DB_NAME", "RunDirBusy", "RunStore", "claim_run_dir"]
