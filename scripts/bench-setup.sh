#!/usr/bin/env bash
# Installs what the benchmarks need on a fresh machine: Mosquitto and RabbitMQ (Debian's
# packages), which loadtest/bench_mqtt.py and loadtest/bench_amqp.py compare TideMQ with, and
# the project with its "bench" extra (psutil, amqtt...) in ./.venv. Safe to run again: what is
# there already is kept.
#
#   scripts/bench-setup.sh && .venv/bin/python -m loadtest.bench_mqtt --quick
#   scripts/bench-setup.sh && .venv/bin/python -m loadtest.bench_amqp --quick
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
fi
MISSING=()
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    MISSING+=(mosquitto)
fi
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ ! -x /usr/sbin/rabbitmq-server ]; then
    MISSING+=(rabbitmq-server)
fi
if [ ${#MISSING[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    # The benchmarks start their own Mosquitto and RabbitMQ nodes on free loopback ports with
    # their own config and data in a temp dir; the system services these packages may start
    # (localhost:1883, :5672) are not used, and RabbitMQ's is stopped below.
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${MISSING[@]}"
    if [[ " ${MISSING[*]} " == *" rabbitmq-server "* ]]; then
        # the package's own node would hold port 5672, 25672 and CPU: bench_amqp starts its own
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            $SUDO systemctl stop rabbitmq-server >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            $SUDO service rabbitmq-server stop >/dev/null 2>&1 || true
        fi
    fi
fi

VENV_EXTRAS=bench . scripts/venv.sh

MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
echo "bench-setup: $("$MOSQUITTO" -h | head -n 1 || true);" \
    "rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo MISSING);" \
    "amqtt $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("amqtt"))' 2>/dev/null \
             || echo 'MISSING: add "amqtt~=0.12.1" to the bench extra in pyproject.toml')"
