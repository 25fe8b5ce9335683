#!/usr/bin/env bash
# Installs TideMQ into ./.venv and runs the gateway on its embedded defaults
# (data in ./data, MQTT 127.0.0.1:1883, AMQP 127.0.0.1:5672, remoting 127.0.0.1:9876).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_EXTRAS= . scripts/venv.sh
exec .venv/bin/tidemq serve "$@"
