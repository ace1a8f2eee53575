"""A compare's files: compare.json/csv (one row per arm and seed), compare_summary.json/csv, curves.csv; reading
them back (or a compare's store, when it was killed before writing them), and pooling compares of different
seeds into one result set."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

from ..store.db import RunStore
from ..trainer.charged import charged_by_outcome
from ..trainer.records import CurvePoint
from .results import ArmResult, add_ratios, summarize

CURVE_FIELDS = ("arm", "seed", "step", "harness_id", "val_score", "train_score", "wall_s", "agent_executions",
                "cached_executions", "optimizer_calls", "optimizer_tokens", "accepted", "charged_s", "taken")


def curve_rows(results: list[ArmResult]) -> list[dict[str, object]]:
    return [p.model_dump(mode="json") | {"seed": r.seed} for r in results for p in r.curve]


def write_results(results: list[ArmResult], directory: Path) -> tuple[Path, Path]:
    """compare.json / compare.csv (one row per arm and seed), compare_summary.json / .csv (mean ± CI per arm)
    and curves.csv (every curve point, per arm and seed). Returns the first two paths."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in results]
    json_path, csv_path = directory / "compare.json", directory / "compare.csv"
    json_path.write_text(json.dumps(rows, indent=1))
    _csv(csv_path, rows, [k for k in rows[0] if k not in ("test_per_task", "charged_parts", "step_outcomes")]
         if rows else [])
    summary = summarize(results)
    (directory / "compare_summary.json").write_text(json.dumps(summary, indent=1))
    _csv(directory / "compare_summary.csv", summary, list(summary[0]) if summary else [])
    _csv(directory / "curves.csv", curve_rows(results), list(CURVE_FIELDS))
    return json_path, csv_path


def arm_result(row: dict[str, object]) -> ArmResult:
    names = {f.name for f in fields(ArmResult)}
    return ArmResult(**{k: v for k, v in row.items() if k in names})  # type: ignore[arg-type]


def stored_results(run_dir: Path) -> list[ArmResult]:
    """The arms a compare finished, read from its run store (each arm's row and curve is recorded as soon as
    the arm ends, its seed's ratios when the seed ends, so a compare killed mid-way gives every arm it finished)."""
    store = RunStore(run_dir)
    try:
        curves = dict(store.records("compare", "curve"))
        results = []
        for key, row in store.records("compare", "arm"):
            result = arm_result(row)
            result.curve = [CurvePoint.model_validate(p) for p in curves.get(key, [])]
            results.append(result)
        return with_step_outcomes(results, store)
    finally:
        store.close()


def with_step_outcomes(results: list[ArmResult], store: RunStore) -> list[ArmResult]:
    """`results` with the step outcomes their rows lack (rows recorded before rows named them) read from the
    compare's store, where it holds the arm's training run."""
    for result in results:
        if not result.step_outcomes and (run_id := train_run_id(store, result.arm, result.seed)) is not None:
            result.step_outcomes = {k: list(v) for k, v in charged_by_outcome(store, run_id).items()}
    return results


def train_run_id(store: RunStore, arm: str, seed: int) -> str | None:
    """The training run of `arm` and `seed` in a compare's store (an arm recorded before its row named its
    step outcomes is read back through it); None when there is not exactly one."""
    found = [run["id"] for run in store.runs_matching(f"train-{arm}-")
             if run["kind"] == "train" and _seed_of(run.get("config")) == seed]
    return found[0] if len(found) == 1 else None


def _seed_of(config: object) -> int | None:
    data = json.loads(config) if isinstance(config, str) and config else config
    run = data.get("run") if isinstance(data, dict) else None
    return run.get("seed") if isinstance(run, dict) else None


def read_results(path: Path) -> list[ArmResult]:
    """The rows a compare wrote (a run directory, or its compare.json), each with its curve from the
    curves.csv beside it when there is one (and, from a run directory's store, the step outcomes its rows
    lack); a run directory without compare.json (a compare still running, or killed) gives the seeds its
    store holds. ValueError, naming the file, for a missing or malformed one."""
    json_path = path / "compare.json" if path.is_dir() else path
    if path.is_dir() and not json_path.exists() and (path / "ecdysis.sqlite").exists():
        if not (results := stored_results(path)):
            raise ValueError(f"{path}: its store holds no finished compare arm (a train run, or a compare "
                             "killed in its first arm)")
        return results
    try:
        rows = json.loads(json_path.read_text())
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise ValueError("expected a list of rows, one per arm and seed")
        results = [arm_result(row) for row in rows]
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{json_path}: not a compare result ({exc}); pass a compare run directory or its "
                         "compare.json") from exc
    curves_path = json_path.with_name("curves.csv")
    if curves_path.exists():
        with curves_path.open(newline="") as f:
            points = list(csv.DictReader(f))
        for r in results:
            r.curve = [CurvePoint.model_validate({k: (v if v != "" else None) for k, v in p.items() if k != "seed"})
                       for p in points if p["arm"] == r.arm and int(p["seed"]) == r.seed]
    if path.is_dir() and (path / "ecdysis.sqlite").exists():
        store = RunStore(path)
        try:
            return with_step_outcomes(results, store)
        finally:
            store.close()
    return results


def rate_tables(results: list[ArmResult]) -> list[str]:
    """The rate-table versions the results were charged under (unrecorded ones left out), sorted."""
    return sorted({r.rates_version for r in results if r.rates_version})


def pool_results(paths: list[Path]) -> list[ArmResult]:
    """The rows of several compares (e.g. one seed per session) as one result set, ratios recomputed per seed;
    ValueError when two give the same arm and seed (pooling them would count one seed twice) or when they were
    charged under different rate tables (their charged seconds are not the same unit)."""
    pooled: list[ArmResult] = []
    seen: dict[tuple[str, int], Path] = {}
    for path in paths:
        for r in read_results(path):
            if (r.arm, r.seed) in seen:
                raise ValueError(f"{r.arm} seed {r.seed} is in both {seen[(r.arm, r.seed)]} and {path}; "
                                 "pool compares of different seeds")
            seen[(r.arm, r.seed)] = path
            pooled.append(r)
    if len(tables := rate_tables(pooled)) > 1:
        raise ValueError(f"these compares were charged under different rate tables (versions {', '.join(tables)}); "
                         "charged seconds compare only under one table (docs/claim.md): pool compares of one table")
    add_ratios(pooled)
    return pooled


def _csv(path: Path, rows: list[dict[str, object]], fields: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
