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

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
fi
exit "$status"
