#!/usr/bin/env bash
# Installs TideMQ into ./.venv (the first time, and again only when pyproject.toml changed: see
# venv.sh) and runs the gateway on its embedded defaults: data in ./data, MQTT 127.0.0.1:1883,
# AMQP 127.0.0.1:5672, remoting 127.0.0.1:9876, and the metrics/admin listener (`tidemq ctl`,
# the dashboard) on 127.0.0.1:9100 -- loopback only, as every default listener.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_EXTRAS= . scripts/venv.sh
# metrics on for the quick start unless the caller decides: a --metrics-bind flag, a config
# file (its metrics_bind), or TIDEMQ_METRICS_BIND (empty: off)
case " $* " in
    *" --metrics-bind"* | *" --config"*) ;;
    *) [ -n "${TIDEMQ_CONFIG:-}" ] || export TIDEMQ_METRICS_BIND="${TIDEMQ_METRICS_BIND-127.0.0.1:9100}" ;;
esac
exec .venv/bin/tidemq serve "$@"
