#!/usr/bin/env bash
# Run the test suite (installs what is missing first). Extra arguments go to pytest, e.g. `scripts/test.sh -m slow`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
