#!/usr/bin/env bash
# Installs the Debian packages the test suite needs beyond Python: chromium and its driver (the
# dashboard test drives a headless browser) and redis-server (the lookup's Redis backend tests).
# Idempotent: does nothing when they are there.
# Run by scripts/test.sh; also usable on its own (as root, or it says what to install).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/chromedriver ] && command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/system-deps.sh: the dashboard test needs chromium and chromedriver, the lookup tests redis-server;" \
         "as root run: apt-get install -y --no-install-recommends chromium chromium-driver redis-server" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver redis-server
