#!/usr/bin/env bash
# A replicated store on this machine, in one command: etcd, three store nodes (one leads, two
# follow) and one gateway node, all on 127.0.0.1, with their data and logs in one directory.
# For trying replication and failover (docs/replication.md); Ctrl-C stops everything.
#
#   bash scripts/local-group.sh [DIR]        (default DIR: ./local-group)
#
# MQTT clients: 127.0.0.1:1883 (the gateway node); AMQP: 127.0.0.1:5672 (relayed to the leader);
# each store node's admin API: 127.0.0.1:9101..9103 (`tidemq ctl --url http://127.0.0.1:9101 cluster`), its
# AMQP (while it leads) 127.0.0.1:5681..5683, apart from the gateway node's 5672.
# Kill the leader (its pid is in DIR/sN.pid) and watch another take over.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-./local-group}")
mkdir -p "$dir"
VENV_EXTRAS= . scripts/venv.sh  # (quick when current; installs again when pyproject.toml changed)
command -v etcd >/dev/null || bash scripts/system-deps.sh
python=.venv/bin/python
pids=()
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT INT TERM

etcd --name local --data-dir "$dir/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster local=http://127.0.0.1:2380 \
    --log-level error >"$dir/etcd.log" 2>&1 &
pids+=($!)
for i in 1 2 3; do
    $python -m gateway serve --role store --node-id "s$i" --replication-group local --etcd 127.0.0.1:2379 \
        --replication-bind "127.0.0.1:1090$i" --remoting-bind "127.0.0.1:987$i" --amqp-bind "127.0.0.1:568$i" \
        --metrics-bind "127.0.0.1:910$i" --data-dir "$dir/s$i" >"$dir/s$i.log" 2>&1 &
    pids+=($!)
    echo $! >"$dir/s$i.pid"
done
$python -m gateway serve --role gateway --node-id gw1 --replication-group local --etcd 127.0.0.1:2379 \
    --mqtt-bind 127.0.0.1:1883 --amqp-bind 127.0.0.1:5672 --metrics-bind 127.0.0.1:9100 \
    --data-dir "$dir/gw1" >"$dir/gw1.log" 2>&1 &
pids+=($!)
echo "etcd 127.0.0.1:2379; store nodes s1-s3 (admin 127.0.0.1:9101-9103); gateway node: MQTT 127.0.0.1:1883," \
     "AMQP 127.0.0.1:5672; logs and pids in $dir. Ctrl-C stops them."
wait
