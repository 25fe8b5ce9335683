#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs the whole suite.
# Exit status is pytest's own (5, "no tests collected", counts as a failure too).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_EXTRAS=test . scripts/venv.sh

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
fi
exit "$status"
