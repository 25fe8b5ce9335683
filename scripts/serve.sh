#!/usr/bin/env bash
# Installs TideMQ into ./.venv and runs the gateway on its embedded defaults
# (data in ./data, MQTT 127.0.0.1:1883, AMQP 127.0.0.1:5672, remoting 127.0.0.1:9876).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/tidemq serve "$@"
