#!/usr/bin/env bash
# The main job: TBA red-teaming on the embedded SmolLM2-135M-Instruct (attacker and victim), then the
# red-team metrics of the trained attacker on 256 attacks. Installs what is missing first.
#   scripts/redteam.sh               # 300 learner updates (~19 min on a Zen 5 AMD EPYC, ~43 on a Zen 4 one, ~42 on a Xeon without bf16) + 3-6 min of start-up and evaluation
#   scripts/redteam.sh --baseline    # only sample and score the UNTRAINED attacker (256 attacks, ~2 min)
# Extra arguments go to `rllib train file` (e.g. --stop '{"tba/weights_version": 20}', --verbose) or, with --baseline, to
# `python -m envs.redteam_eval`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
if [ "${1:-}" = "--baseline" ]; then
  shift
  exec .venv/bin/python -m envs.redteam_eval --num-attacks 256 "$@"
fi
out=$(mktemp)
.venv/bin/rllib train file tuned_examples/tba_redteam.py --storage-path results "$@" | tee "$out"
checkpoint=$(.venv/bin/python -c "import json,sys; t=open(sys.argv[1]).read(); print(json.JSONDecoder().raw_decode(t[t.rindex('\n{')+1:])[0]['checkpoint'])" "$out")
rm -f "$out"
echo "== the trained attacker next to the untrained start: 256 attacks each, 5 victim answers per attack =="
.venv/bin/rllib evaluate "$checkpoint" --num-samples 256 --compare-base --show 3
