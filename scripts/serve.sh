#!/usr/bin/env bash
# Installs TideMQ into ./.venv (the first time, and again only when pyproject.toml changed: see
# venv.sh) and runs the gateway on its embedded defaults: data in ./data, MQTT localhost:1883,
# AMQP localhost:5672, remoting localhost:9876, and the metrics/admin listener (`tidemq ctl`,
# the dashboard) on localhost:9100 -- loopback only (127.0.0.1 and ::1), as every default listener.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_EXTRAS= . scripts/venv.sh
# metrics on for the quick start unless the caller decides: a --metrics-bind flag, a config
# file (its metrics_bind), or TIDEMQ_METRICS_BIND (empty: off)
case " $* " in
    *" --metrics-bind"* | *" --config"*) ;;
    *) [ -n "${TIDEMQ_CONFIG:-}" ] || export TIDEMQ_METRICS_BIND="${TIDEMQ_METRICS_BIND-localhost:9100}" ;;
esac
exec .venv/bin/tidemq serve "$@"
