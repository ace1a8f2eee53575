"""What test-accuracy difference a suite's seeds can resolve (issue 38, docs/claim.md "Results by suite and seed").

Reads exported compares (`compare.json`, read only) and, per contrast, pairs every test task both arms ran on a
seed: the paired differences' spread and share of discordant tasks, the 95% half-width they give now, and at the
registered number of seeds (tasks per seed as now), and the difference an 80%-power two-sided test at 0.05 would
detect there (2.8 standard errors). Tasks are treated as independent: the registered interval also resamples seeds,
so it is wider; this is a floor on what the design resolves, not the decision.

    python benchmarks/claim/resolution.py benchmarks/results/designed/seed* --seeds 8
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from ecdysis.compare.files import read_results
from ecdysis.compare.results import ArmResult
from ecdysis.compare.stats import paired_differences

CONTRASTS = (("serial+library", "serial"), ("aggregate", "serial+library"), ("ecdysis", "aggregate"),
             ("aggregate", "serial"), ("ecdysis", "serial+library"))


def per_task(results: list[ArmResult], arm: str) -> dict[int, dict[str, float]]:
    return {r.seed: r.test_per_task for r in results if r.arm == arm and r.test_per_task}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="+", type=Path, help="exported compare folders (each with compare.json)")
    parser.add_argument("--seeds", type=int, required=True, help="the registered number of seeds")
    args = parser.parse_args()
    try:
        results = [r for folder in args.exports for r in read_results(folder)]
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    print(f"| contrast | seeds | paired tasks | mean | sd | discordant | 95% half-width now | at {args.seeds} seeds "
          f"| detectable (80% power) at {args.seeds} seeds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arm, ref in CONTRASTS:
        by_seed = paired_differences(per_task(results, arm), per_task(results, ref))
        diffs, seeds = [d for seed in by_seed.values() for d in seed], len(by_seed)
        if len(diffs) < 2:
            continue
        sd = statistics.pstdev(diffs)
        at = len(diffs) / seeds * args.seeds
        discordant = sum(d != 0 for d in diffs) / len(diffs)
        print(f"| {arm} vs {ref} | {seeds} | {len(diffs)} | {statistics.mean(diffs):+.3f} | {sd:.3f} | "
              f"{discordant:.2f} | {1.96 * sd / math.sqrt(len(diffs)):.3f} | {1.96 * sd / math.sqrt(at):.3f} | "
              f"{2.8 * sd / math.sqrt(at):.3f} |")


if __name__ == "__main__":
    main()
