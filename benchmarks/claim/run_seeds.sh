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
#                                                  # (with the interim projection, compare-summary --project)
#   benchmarks/claim/run_seeds.sh SUITE --code     # which code the seeds run (below); changes nothing
#   benchmarks/claim/run_seeds.sh SUITE --status   # per seed: arms exported, finished, and the one running
# The seeds run the code pinned in benchmarks/claim/experiment.commit, whatever this checkout holds: a worktree
# of that commit (runs/experiment-code-SHA, made once per commit and never removed by this script) is first on
# PYTHONPATH for every compare (and so for its sandboxed workers), so main's src/ can change, even while a compare
# runs, and the experiment stays on one code. The configs, the suite and the exports are this checkout's.
# Machines here are fresh each session, so finished arms are exported to
# benchmarks/results/{designed,claim-gsm8k,claim-dbbench}/seedS-TAG (TAG: this machine's first run) after every
# seed, when the script is stopped or a compare fails, and with --export; commit the export before the session
# ends. A later machine runs only the arms no other export holds. With each export goes the response cache this
# machine filled (`ecdysis cache export`, benchmarks/results/cache/SUITE-TAG.jsonl.gz), and every carried cache
# file is imported before a compare starts: an arm a stop cut short replays its calls on the next machine in
# seconds, charged the same, and goes on. Pool them all with
#   ecdysis compare-summary benchmarks/results/designed/seed* --registered benchmarks/designed/registered.toml
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/.venv/bin"
SUITE="${1:?usage: run_seeds.sh designed|gsm8k|dbbench [FIRST | --export | --code | --status]}"
[[ -x "$BIN/ecdysis" ]] || { echo "error: $BIN/ecdysis not found; run \`make -C $ROOT models\` first" >&2; exit 2; }
case "$SUITE" in
  designed) CONFIG="$ROOT/benchmarks/designed/compare.toml"; LAST=7; RUNS="$ROOT/runs/designed-compare"
    OUT="$ROOT/benchmarks/results/designed"; DATA=()  # the suite file is named by the config
    REGISTERED="$ROOT/benchmarks/designed/registered.toml"; KINDS="$ROOT/runs/designed.kinds.json"
    SENSITIVITY=0.35,0.4,0.45,0.5 ;;  # post hoc targets for the pooled export (docs/claim.md)
  gsm8k|dbbench) CONFIG="$ROOT/benchmarks/claim/$SUITE.toml"; LAST=2; RUNS="$ROOT/runs/claim-$SUITE"
    OUT="$ROOT/benchmarks/results/claim-$SUITE"; DATA=(--data-dir "${DATA_DIR:-$(cd "$ROOT/.." && pwd)/shared/data}")
    REGISTERED="$ROOT/benchmarks/claim/$SUITE.registered.toml"; KINDS=""; SENSITIVITY="" ;;
  *) echo "error: unknown suite '$SUITE'; one of designed, gsm8k, dbbench" >&2; exit 2 ;;
esac
ARMS=(fixed serial serial+library aggregate ecdysis)
export ECDYSIS_RATES="$ROOT/benchmarks/claim/rates-v4.toml"  # the table the experiment is charged under
mkdir -p "$RUNS"
[[ -f "$RUNS/.tag" ]] || date -u +%Y%m%dT%H%M > "$RUNS/.tag"
TAG="$(cat "$RUNS/.tag")"
CARRIED="$ROOT/benchmarks/results/cache"  # the response caches machines filled, one file per suite and machine

carry_cache() {  # this machine's cache entries since its first run -> $CARRIED/SUITE-TAG.jsonl.gz (main's CLI)
  "$BIN/ecdysis" cache export "$CARRIED/$SUITE-$TAG.jsonl.gz" --since "$TAG" || echo "carrying the cache failed" >&2
}

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
  local seeds=("$OUT"/seed[0-9]*) extra=()
  [[ -e "${seeds[0]}" ]] || return 0
  [[ -n "$KINDS" && -f "$KINDS" ]] && extra=(--groups "$KINDS")
  [[ -n "$SENSITIVITY" ]] && extra+=(--sensitivity "$SENSITIVITY")
  if "$BIN/ecdysis" compare-summary "${seeds[@]}" --registered "$REGISTERED" ${extra[@]+"${extra[@]}"} \
      --project --out "$OUT/pooled" > /dev/null 2>&1; then  # --project: on an interim pool, what 8 seeds may decide
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

PIN_FILE="$ROOT/benchmarks/claim/experiment.commit"

pinned_code() {  # the src/ the compares import: a worktree of the pinned commit ("--dry": never made here)
  local pin sha code
  [[ -f "$PIN_FILE" ]] || { echo "$ROOT/src"; return 0; }  # nothing pinned: this checkout
  pin="$(tr -d '[:space:]' < "$PIN_FILE")"
  sha="$(git -C "$ROOT" rev-parse --verify -q "$pin^{commit}")" || {
    echo "error: $PIN_FILE names '$pin', not a commit of $ROOT" >&2; return 1; }
  code="$ROOT/runs/experiment-code-${sha:0:12}"
  if [[ ! -d "$code/src" ]]; then
    if [[ "${1:-}" == --dry ]]; then echo "$code/src (made at the first compare)"; return 0; fi
    mkdir -p "$ROOT/runs"
    git -C "$ROOT" worktree prune
    git -C "$ROOT" worktree add --detach "$code" "$sha" > /dev/null 2>&1 || {
      echo "error: cannot check out the pinned commit $sha into $code" >&2; return 1; }
  fi
  echo "$code/src"
}

if [[ "${2:-}" == "--status" ]]; then  # reads the exports and the stores; changes nothing
  "$BIN/python" - "$OUT" "$RUNS" "$LAST" <<'EOF'
import json, pathlib, sqlite3, sys
out, runs, last = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
for seed in range(last + 1):
    exported = sorted({row["arm"] for p in out.glob(f"seed{seed}-*/compare.json") for row in json.loads(p.read_text())})
    line = f"seed {seed}: exported {', '.join(exported) or 'none'}"
    db = runs / f"seed{seed}" / "ecdysis.sqlite"
    if db.exists():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        finished = [k.split("/")[0] for (k,) in con.execute("SELECT key FROM records WHERE run_id='compare' AND kind='arm'")]
        curves = con.execute("SELECT run_id, MAX(json_extract(data, '$.charged_s')), COUNT(*) FROM records "
                             "WHERE kind='curve' AND run_id LIKE 'train-%' GROUP BY run_id").fetchall()
        running = [f"{r.split('-')[1]} at {s:.0f} charged s ({n - 1} steps)" for r, s, n in curves
                   if s is not None and r.split("-")[1] not in finished]
        line += f"; this machine's store: finished {', '.join(finished) or 'none'}"
        line += f"; unfinished {', '.join(running)}" if running else ""
        con.close()
    print(line)
EOF
  exit 0
fi

if [[ "${2:-}" == "--code" ]]; then
  if [[ -f "$PIN_FILE" ]]; then
    echo "the seeds run $(pinned_code --dry): the commit pinned in $PIN_FILE ($(tr -d '[:space:]' < "$PIN_FILE"))"
  else
    echo "the seeds run $ROOT/src: nothing is pinned ($PIN_FILE is missing)"
  fi
  exit 0
fi

if [[ "${2:-}" == "--export" ]]; then
  for dir in "$RUNS"/seed*; do  # seedS only: a store set aside (seed0.failed-...) is never pooled
    [[ -d "$dir" && "${dir##*/seed}" =~ ^[0-9]+$ ]] && export_seed "${dir##*/seed}"
  done
  pool_exports
  carry_cache
  exit 0
fi

if [[ "$SUITE" == designed && ! -f "$ROOT/runs/designed.jsonl" ]]; then
  "$BIN/python" "$ROOT/benchmarks/designed/make_suite.py" "$ROOT/runs/designed.jsonl" \
    --kinds "$ROOT/runs/designed.kinds.json"
fi
CODE_SRC="$(pinned_code)"
echo "the compares import $CODE_SRC"
carried=("$CARRIED"/*.jsonl.gz)
[[ -e "${carried[0]}" ]] && "$BIN/ecdysis" cache import "${carried[@]}"  # a bad file stops here, nothing imported
FIRST="${2:-0}"
[[ "$FIRST" =~ ^[0-9]+$ ]] && (( FIRST <= LAST )) || {
  echo "error: FIRST should be a seed 0-$LAST, --export or --code (got '$FIRST')" >&2; exit 2; }
# A session cut off hard runs no trap: so the cache is also carried every CARRY_EVERY s (default 600) while the
# seeds run, and the uncommitted file goes with the checkout to the next machine (atomic: no half file).
( while sleep "${CARRY_EVERY:-600}"; do carry_cache > /dev/null; done ) &
CARRIER=$!
# a kill or a failed compare exports too
trap 'kill "$CARRIER" 2> /dev/null; if [[ -n "${RUNNING:-}" ]]; then export_seed "$RUNNING" && pool_exports; carry_cache; fi' EXIT
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
  carry_cache
  echo "$(date -u +%FT%TZ) $SUITE seed $S done"
done
