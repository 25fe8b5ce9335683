#!/usr/bin/env bash
# Installs the Debian packages the test suite needs beyond Python: chromium and its driver (the
# dashboard test drives a headless browser), redis-server (the lookup's Redis backend tests) and
# a Java 17 runtime (the Spark tests run a local Spark), etcd (the replicated store's
# leadership; its tests start their own etcd), Mosquitto (the remote of the rules' MQTT bridge
# target) and PostgreSQL (the rules' PostgreSQL target; its tests run initdb and the server from
# /usr/lib/postgresql/*/bin themselves, as the postgres user the package creates).
# Idempotent: does nothing when they are there.
# Run by scripts/test.sh; also usable on its own (as root, or it says what to install).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ] && command -v redis-server >/dev/null 2>&1 \
        && command -v java >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 && [ -x /usr/sbin/mosquitto ] \
        && compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/system-deps.sh: the dashboard test needs chromium and chromedriver, the lookup tests redis-server," \
         "the Spark tests Java 17, the replication tests etcd, the rules tests mosquitto and postgresql; as root run:" \
         "apt-get install -y --no-install-recommends chromium chromium-driver redis-server etcd-server mosquitto" \
         "postgresql openjdk-17-jre-headless" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
packages="chromium chromium-driver redis-server etcd-server mosquitto postgresql"
command -v java >/dev/null 2>&1 || packages="$packages openjdk-17-jre-headless"
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $packages
