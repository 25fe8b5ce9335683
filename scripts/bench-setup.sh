#!/usr/bin/env bash
# Installs what the benchmarks need on a fresh machine: Mosquitto (Debian's package), which
# loadtest/bench_mqtt.py compares TideMQ with, and the project with its "bench" extra (psutil,
# amqtt...) in ./.venv. Safe to run again: what is there already is kept.
#
#   scripts/bench-setup.sh && .venv/bin/python -m loadtest.bench_mqtt --quick
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    SUDO=
    if [ "$(id -u)" -ne 0 ]; then
        SUDO=sudo
    fi
    $SUDO apt-get update -qq
    # The benchmark starts its own Mosquitto on a free loopback port with its own config; the
    # system service this package may enable (localhost:1883) is not used.
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto
fi

VENV_EXTRAS=bench . scripts/venv.sh

MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
echo "bench-setup: $("$MOSQUITTO" -h | head -n 1 || true);" \
    "amqtt $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("amqtt"))' 2>/dev/null \
             || echo 'MISSING: add "amqtt~=0.12.1" to the bench extra in pyproject.toml')"
