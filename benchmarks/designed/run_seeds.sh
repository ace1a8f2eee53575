#!/usr/bin/env bash
# The designed suite's seeds: benchmarks/claim/run_seeds.sh designed [FIRST | --export] (see there).
exec "$(dirname "$0")/../claim/run_seeds.sh" designed "$@"
