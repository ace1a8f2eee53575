#!/usr/bin/env bash
# Issue 38's whole queue, in its registered order from here on: the designed suite's seeds 0-7, then GSM8K's and
# DBBench's seeds 0-2 (run_seeds.sh each; a suite whose seeds are all exported passes in seconds). Resumable:
#   nohup setsid benchmarks/claim/queue.sh > runs/queue.out 2>&1 < /dev/null &
# Stop it (the running compare marks its run interrupted and its seed's finished arms are exported):
#   pkill -f claim/queue.sh; pkill -f run_seeds.sh; pkill -TERM -f "ecdysis compare -c"
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
for suite in designed gsm8k dbbench; do
  echo "$(date -u +%FT%TZ) queue: $suite"
  "$HERE/run_seeds.sh" "$suite"  # a kill or a failed compare stops the queue here (set -e)
done
echo "$(date -u +%FT%TZ) queue: every suite done"
