#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs the whole suite.
# Exit status is pytest's own (5, "no tests collected", counts as a failure too).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_EXTRAS=test . scripts/venv.sh
bash scripts/system-deps.sh  # chromium, chromedriver (dashboard test), redis-server (lookup tests), Java (Spark)

# Java, for the Spark source tests (pyspark runs a local Spark, a JVM; Spark 4 wants Java 17+)
if ! command -v java >/dev/null 2>&1; then
    echo "scripts/test.sh: Java 17 is needed for the Spark tests (apt-get install openjdk-17-jre-headless)" >&2
    exit 1
fi

# ali-ons, the JavaScript RocketMQ client the remoting tests drive (node and npm are on the machine)
if ! command -v npm >/dev/null 2>&1; then
    echo "scripts/test.sh: node and npm are needed for the remoting tests (apt-get install nodejs npm)" >&2
    exit 1
fi
npm ci --prefix tests/remoting_js --no-audit --no-fund --loglevel=error

# the layer contracts in pyproject.toml ([tool.importlinter])
.venv/bin/lint-imports
# the type check of the product packages ([tool.mypy] in pyproject.toml)
.venv/bin/mypy

# The suite runs twice: against the compiled build of the message path (the C extensions the
# install built from the modules pyproject.toml lists under [tool.tidemq] compiled), then against
# the same modules interpreted (TIDEMQ_PURE_PYTHON=1: the test set-up, tests/builds.py, imports
# them from their .py files), the reference. The test set-up stops at once if an extension is
# older than its source (`bash scripts/venv.sh` rebuilds it). The differential tests (tests/test_native_*.py) compare the two builds within each run.
# TEST_BUILDS=compiled (or interpreted) runs one of them only, for a quicker local run.
status=0
for build in ${TEST_BUILDS:-compiled interpreted}; do
    echo "scripts/test.sh: the suite against the $build build" >&2
    run_status=0
    if [ "$build" = interpreted ]; then
        TIDEMQ_PURE_PYTHON=1 .venv/bin/python -m pytest "$@" || run_status=$?
    else
        env -u TIDEMQ_PURE_PYTHON .venv/bin/python -m pytest "$@" || run_status=$?
    fi
    if [ "$run_status" -eq 5 ]; then
        echo "scripts/test.sh: pytest collected no tests ($build build); that is a failure" >&2
    fi
    [ "$run_status" -eq 0 ] || status=$run_status
done
exit "$status"
