"""`ecdysis compare` and `compare-summary`: arms run side by side (run.py), their rows and tables (results.py,
table.py), their files and the pooling of seeds (files.py), and the claim's statistics over seeds (stats.py,
factorial.py, verdict.py, groups.py, outcomes.py). Above the trainer: it runs the trainer's methods as arms and
never changes how one trains."""
