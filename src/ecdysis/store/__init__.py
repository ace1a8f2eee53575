"""Run store: one SQLite database per run directory."""

from .db import DB_NAME, RunStore

__all__ = ["DB_NAME", "RunStore"]
