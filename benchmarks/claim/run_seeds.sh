#!/usr/bin/env bash
# Issue 38's claim experiment, one seed per `ecdysis compare` (the suites' READMEs pre-register them):
#   designed  benchmarks/designed/compare.toml, seeds 0-7 (the suite is built first if it is missing)
#   gsm8k     benchmarks/claim/gsm8k.toml, seeds 0-2
#   dbbench   benchmarks/claim/dbbench.toml, seeds 0-2
# Every seed under rate table v4, each resumable (run the same command after a kill: it goes on where it
# stopped). Task data from $DATA_DIR (default ../shared/data beside the checkout).
#   benchmarks/claim/run_seeds.sh SUITE [FIRST]    # nohup setsid ... & to run it in the background
#   benchmarks/claim/run_seeds.sh SUITE --export   # this machine's finished arms -> benchmarks/results/,
#                                                  # and every export pooled -> benchmarks/results/SUITE/pooled
#   benchmarks/claim/run_seeds.sh SUITE --code     # which code the seeds run (below), and nothing else
# The seeds run the trainer code pinned in benchmarks/claim/experiment.commit, whatever main's HEAD: when this
# checkout's src/ differs from it, a worktree of the pinned commit (runs/experiment-code, made on demand) is put
# first on PYTHONPATH for the compares, so main's trainer can change while the experiment runs on one code.
# The configs, suite and exports (compare-summary) are this checkout's.
# Machines here are fresh each session, so finished arms are exported to
# benchmarks/results/{designed,claim-gsm8k,claim-dbbench}/seedS-TAG (TAG: this machine's first run) after every
# seed, when the script is stopped or a compare fails, and with --export; commit the export before the session
# ends. A later machine runs only the arms no other export holds. Pool them all with
#   ecdysis compare-summary benchmarks/results/designed/seed* --registered benchmarks/designed/registered.toml
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/.venv/bin"
SUITE="${1:?usage: run_seeds.sh designed|gsm8k|dbbench [FIRST | --export]}"
[[ -x "$BIN/ecdysis" ]] || { echo "error: $BIN/ecdysis not found; run \`make -C $ROOT models\` first" >&2; exit 2; }
case "$SUITE" in
  designed) CONFIG="$ROOT/benchmarks/designed/compare.toml"; LAST=7; RUNS="$ROOT/runs/designed-compare"
    OUT="$ROOT/benchmarks/results/designed"; DATA=()  # the suite file is named by the config
    REGISTERED="$ROOT/benchmarks/designed/registered.toml"; KINDS="$ROOT/runs/designed.kinds.json" ;;
  gsm8k|dbbench) CONFIG="$ROOT/benchmarks/claim/$SUITE.toml"; LAST=2; RUNS="$ROOT/runs/claim-$SUITE"
    OUT="$ROOT/benchmarks/results/claim-$SUITE"; DATA=(--data-dir "${DATA_DIR:-$(cd "$ROOT/.." && pwd)/shared/data}")
    REGISTERED="$ROOT/benchmarks/claim/$SUITE.registered.toml"; KINDS="" ;;
  *) echo "error: unknown suite '$SUITE'; one of designed, gsm8k, dbbench" >&2; exit 2 ;;
esac
ARMS=(fixed serial serial+library aggregate ecdysis)
export ECDYSIS_RATES="$ROOT/benchmarks/claim/rates-v4.toml"  # the table the experiment is charged under
mkdir -p "$RUNS"
[[ -f "$RUNS/.tag" ]] || date -u +%Y%m%dT%H%M > "$RUNS/.tag"
TAG="$(cat "$RUNS/.tag")"

export_seed() {  # the finished arms of one seed's run directory (its store, while the seed runs)
  local S="$1" said
  if said="$("$BIN/ecdysis" compare-summary "$RUNS/seed$S" --out "$OUT/seed$S-$TAG" 2>&1 > /dev/null)"; then
    echo "exported $RUNS/seed$S -> $OUT/seed$S-$TAG"
  elif grep -q "no finished compare arm" <<< "$said"; then
    echo "seed $S: no finished arm to export yet"
  else
    echo "seed $S: export failed: $said" >&2; return 1
  fi
}

pool_exports() {  # every machine's exported seeds, under the registration -> $OUT/pooled (summary.md: the tables)
  local seeds=("$OUT"/seed[0-9]*) groups=()
  [[ -e "${seeds[0]}" ]] || return 0
  [[ -n "$KINDS" && -f "$KINDS" ]] && groups=(--groups "$KINDS")
  if "$BIN/ecdysis" compare-summary "${seeds[@]}" --registered "$REGISTERED" ${groups[@]+"${groups[@]}"} \
      --out "$OUT/pooled" > /dev/null 2>&1; then
    echo "pooled ${#seeds[@]} exports -> $OUT/pooled/summary.md"
  else
    echo "pooling the exports failed: run ecdysis compare-summary $OUT/seed* --registered $REGISTERED" >&2
  fi
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

pinned_code() {  # the src/ the compares import: this checkout's when it matches the pin, else the pin's worktree
  local pin code="$ROOT/runs/experiment-code"
  [[ -f "$ROOT/benchmarks/claim/experiment.commit" ]] || { echo "$ROOT/src"; return 0; }
  pin="$(tr -d '[:space:]' < "$ROOT/benchmarks/claim/experiment.commit")"
  if git -C "$ROOT" diff --quiet "$pin" -- src; then echo "$ROOT/src"; return 0; fi
  if [[ "$(git -C "$code" rev-parse HEAD 2>/dev/null)" != "$(git -C "$ROOT" rev-parse "$pin^{commit}")" ]]; then
    rm -rf "$code"
    git -C "$ROOT" worktree prune
    git -C "$ROOT" worktree add --detach "$code" "$pin" > /dev/null 2>&1 || {
      echo "error: cannot check out the pinned commit $pin into $code" >&2; return 1; }
  fi
  echo "$code/src"
}

if [[ "${2:-}" == "--code" ]]; then
  code="$(pinned_code)"
  echo "the seeds run $code ($([[ "$code" == "$ROOT/src" ]] && echo "this checkout: it matches" || echo \
    "this checkout's src/ differs from") benchmarks/claim/experiment.commit $(cat "$ROOT/benchmarks/claim/experiment.commit"))"
  exit 0
fi

if [[ "${2:-}" == "--export" ]]; then
  for dir in "$RUNS"/seed*; do  # seedS only: a store set aside (seed0.failed-...) is never pooled
    [[ -d "$dir" && "${dir##*/seed}" =~ ^[0-9]+$ ]] && export_seed "${dir##*/seed}"
  done
  pool_exports
  exit 0
fi

if [[ "$SUITE" == designed && ! -f "$ROOT/runs/designed.jsonl" ]]; then
  "$BIN/python" "$ROOT/benchmarks/designed/make_suite.py" "$ROOT/runs/designed.jsonl" \
    --kinds "$ROOT/runs/designed.kinds.json"
fi
CODE_SRC="$(pinned_code)"
echo "the compares import $CODE_SRC"
FIRST="${2:-0}"
[[ "$FIRST" =~ ^[0-9]+$ ]] && (( FIRST <= LAST )) || {
  echo "error: FIRST should be a seed 0-$LAST, --export or --code (got '$FIRST')" >&2; exit 2; }
trap '[[ -n "${RUNNING:-}" ]] && export_seed "$RUNNING" && pool_exports' EXIT  # a kill or a failed compare exports too
for S in $(seq "$FIRST" "$LAST"); do
  done_arms="$(exported_elsewhere "$S")"
  todo=()
  for arm in "${ARMS[@]}"; do grep -qxF "$arm" <<< "$done_arms" || todo+=("$arm"); done
  if [[ ${#todo[@]} -eq 0 ]]; then echo "$SUITE seed $S: every arm exported already"; continue; fi
  echo "$(date -u +%FT%TZ) $SUITE seed $S start: ${todo[*]}"
  RUNNING="$S"
  PYTHONPATH="$CODE_SRC" "$BIN/ecdysis" compare -c "$CONFIG" ${DATA[@]+"${DATA[@]}"} --arms "$(IFS=,; echo "${todo[*]}")" \
    --seeds 1 --set run.seed="$S" --run-dir "$RUNS/seed$S"
  RUNNING=""
  export_seed "$S"
  pool_exports
  echo "$(date -u +%FT%TZ) $SUITE seed $S done"
done
