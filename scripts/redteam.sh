#!/usr/bin/env bash
# The main job: the red-team example on the embedded SmolLM2-135M-Instruct (installs what is missing first).
# Extra arguments go to the example, e.g. `scripts/redteam.sh --num-attacks 256`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m envs.redteam_eval "$@"
