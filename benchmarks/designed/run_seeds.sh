#!/usr/bin/env bash
# Issue 38's designed suite, one seed per `ecdysis compare` (README.md pre-registers it): builds the suite if
# it is missing, then runs seeds FIRST..7 in order under rate table v4, each resumable (run it again after a
# kill: it goes on where it stopped).
#   benchmarks/designed/run_seeds.sh [FIRST]     # default 0; nohup setsid ... & to run it in the background
#   benchmarks/designed/run_seeds.sh --export    # this machine's finished arms -> benchmarks/results/designed/
# Machines here are fresh each session, so finished arms are exported (after every seed, and with --export)
# to benchmarks/results/designed/seedS-TAG (TAG: this machine's first run) and committed; a later machine
# runs only the arms no other export holds. Pool them all with
#   ecdysis compare-summary benchmarks/results/designed/seed* --registered benchmarks/designed/registered.toml
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="$ROOT/.venv/bin"
RUNS="$ROOT/runs/designed-compare"
OUT="$ROOT/benchmarks/results/designed"
ARMS=(fixed serial serial+library aggregate ecdysis)
export ECDYSIS_RATES="$ROOT/benchmarks/claim/rates-v4.toml"  # the table the experiment is charged under
mkdir -p "$RUNS"
[[ -f "$RUNS/.tag" ]] || date -u +%Y%m%dT%H%M > "$RUNS/.tag"
TAG="$(cat "$RUNS/.tag")"

export_seed() {  # the finished arms of one seed's run directory, as compare-summary reads them
  local S="$1"
  "$BIN/ecdysis" compare-summary "$RUNS/seed$S" --out "$OUT/seed$S-$TAG" > /dev/null 2>&1 \
    && echo "exported $RUNS/seed$S -> $OUT/seed$S-$TAG" || echo "seed $S: no finished arm to export yet"
}

exported_elsewhere() {  # arms of seed S that another machine's export already holds
  "$BIN/python" - "$OUT" "$1" "$TAG" <<'EOF'
import json, pathlib, sys
out, seed, tag = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for path in sorted(out.glob(f"seed{seed}-*/compare.json")):
    if path.parent.name != f"seed{seed}-{tag}":
        print("\n".join(row["arm"] for row in json.loads(path.read_text())))
EOF
}

if [[ "${1:-}" == "--export" ]]; then
  for dir in "$RUNS"/seed*; do [[ -d "$dir" ]] && export_seed "${dir##*/seed}"; done
  exit 0
fi

[[ -f "$ROOT/runs/designed.jsonl" ]] || "$BIN/python" "$HERE/make_suite.py" "$ROOT/runs/designed.jsonl" \
  --kinds "$ROOT/runs/designed.kinds.json"
for S in $(seq "${1:-0}" 7); do
  done_arms="$(exported_elsewhere "$S")"
  todo=()
  for arm in "${ARMS[@]}"; do grep -qxF "$arm" <<< "$done_arms" || todo+=("$arm"); done
  if [[ ${#todo[@]} -eq 0 ]]; then echo "seed $S: every arm exported already"; continue; fi
  echo "$(date -u +%FT%TZ) seed $S start: ${todo[*]}"
  "$BIN/ecdysis" compare -c "$HERE/compare.toml" --arms "$(IFS=,; echo "${todo[*]}")" \
    --seeds 1 --set run.seed="$S" --run-dir "$RUNS/seed$S"
  export_seed "$S"
  echo "$(date -u +%FT%TZ) seed $S done"
done
