#!/usr/bin/env bash
# rllib-tba's performance, side by side in one run (installs what is missing first):
#   scripts/bench.sh            # the SmolLM2 red-team tuned example (~20 min on 2 cores): benchmarks/results.{json,md},
#                               # benchmarks/{ratios,timeline}.png and README's performance table
#   scripts/bench.sh --quick    # the tiny model (< 3 min), e.g. with --out /tmp/bench
# Extra arguments go to benchmarks/bench.py (--repeats N, --out DIR, --buffer-samples N).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python benchmarks/bench.py "$@"
