"""`ecdysis compare` and `compare-summary`: arms run side by side (run.py), their results (results.py, table.py)
and the claim's statistics over seeds (stats.py, factorial.py, verdict.py, groups.py). Above the trainer: it runs
the trainer's methods as arms and never changes how one trains."""
