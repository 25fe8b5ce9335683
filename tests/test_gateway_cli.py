"""The ``tidemq`` command: configuration precedence, serve/shutdown, refusals with clear messages."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from protocols.mqtt.codec import encode
from protocols.mqtt.packets import MQTT_3_1_1, ConnAck, Connect

ROOT = Path(__file__).resolve().parent.parent


def test_config_precedence_file_then_env_then_flags(tmp_path):
    toml = tmp_path / "tidemq.toml"
    toml.write_text('data_dir = "/from/file"\nflush = "sync"\n[mqtt]\nbind = "0.0.0.0:1884"\n[store]\nport = 7000\n')
    cfg = load_config(toml, env={"TIDEMQ_FLUSH": "async", "TIDEMQ_AMQP_BIND": ""}, overrides={"data_dir": "/flag"})
    assert str(cfg.data_dir) == "/flag" and cfg.source["data_dir"] == "command line"
    assert cfg.flush == "async" and cfg.source["flush"] == "environment"
    assert cfg.mqtt_bind == "0.0.0.0:1884" and cfg.store_port == 7000
    assert cfg.amqp_bind == ""  # empty bind: listener off
    assert cfg.remoting_bind == "localhost:9876"


def test_config_defaults_and_errors(tmp_path):
    cfg = load_config(env={})
    assert (str(cfg.data_dir), cfg.mqtt_bind, cfg.amqp_bind, cfg.remoting_bind) == (
        "data", "localhost:1883", "localhost:5672", "localhost:9876",
    )
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        load_config(env={"TIDEMQ_BOGUS": "1"})
    with pytest.raises(ConfigError, match="segment_size"):
        load_config(env={"TIDEMQ_SEGMENT_SIZE": "big"})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load_config(env={}, overrides={"mqtt_bind": "1883"})
    bad = tmp_path / "bad.toml"
    bad.write_text("flush = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    with pytest.raises(ConfigError, match="connect_timeout_s"):
        load_config(env={"TIDEMQ_CONNECT_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match="read_timeout_s"):
        load_config(env={"TIDEMQ_READ_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match="remoting_idle_timeout_s"):
        load_config(env={"TIDEMQ_REMOTING_IDLE_TIMEOUT_S": "-1"})
    with pytest.raises(ConfigError, match="needs cluster_token"):  # the store link would bypass the ACL
        load_config(env={}, overrides={"role": "store", "acl_file": "acl"})


def test_a_bad_value_names_the_key_and_where_it_came_from(tmp_path):
    """Values each field accepts are checked after all sources merge; the message still names
    the file (or the environment, or the command line) the bad value came from."""
    toml = tmp_path / "tidemq.toml"
    toml.write_text('flush = "sometimes"\n')
    with pytest.raises(ConfigError, match=f"{re.escape(str(toml))}: flush must be 'sync' or 'async'"):
        load_config(toml, env={})
    toml.write_text('[mqtt]\nbind = "1883"\nreceive_maximum = 0\n')
    with pytest.raises(ConfigError, match=f"{re.escape(str(toml))}: mqtt_bind: expected HOST:PORT"):
        load_config(toml, env={})
    with pytest.raises(ConfigError, match="environment: role must be"):
        load_config(env={"TIDEMQ_ROLE": "leader"})
    with pytest.raises(ConfigError, match="command line: mqtt_receive_maximum"):
        load_config(env={}, overrides={"mqtt_receive_maximum": 0})
    toml.write_text('flush = "sometimes"\n')
    proc = tidemq("serve", "--config", str(toml))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and str(toml) in err and "flush" in err, err


def tidemq(*args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", *args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def wait_for_line(proc: subprocess.Popen, pattern: str, timeout: float = 30) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r}; got: {''.join(lines)}")


def serve_args(data_dir: Path) -> list[str]:
    return ["serve", "--data-dir", str(data_dir), "--mqtt-bind", "127.0.0.1:0",
            "--amqp-bind", "127.0.0.1:0", "--remoting-bind", ""]


def test_serve_binds_listeners_and_shuts_down_cleanly_on_sigterm(tmp_path):
    proc = tidemq(*serve_args(tmp_path / "data"))
    try:
        lines = wait_for_line(proc, "gateway ready")
        text = "".join(lines)
        assert 'msg="listener off" protocol=remoting' in text
        port = int(re.search(r"protocol=mqtt address=127\.0\.0\.1:(\d+)", text).group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.settimeout(5)
            sock.sendall(encode(Connect("cli-test"), MQTT_3_1_1))
            assert sock.recv(4) == encode(ConnAck(), MQTT_3_1_1)  # the MQTT gateway answers
        # a second gateway on the same data dir is refused with a clear message
        second = tidemq(*serve_args(tmp_path / "data"))
        _, err = second.communicate(timeout=30)
        assert second.returncode == 2 and "in use by another process" in err
    finally:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert 'msg="store closed"' in err and 'msg="gateway stopped"' in err
    assert all(re.match(r"ts=\S+ level=\w+ logger=\S+ msg=\"", line) for line in err.splitlines() if line)


def test_serve_refuses_a_corrupt_store_until_repair(tmp_path):
    data = tmp_path / "data"
    proc = tidemq(*serve_args(data))
    wait_for_line(proc, "gateway ready")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    # write two records through the store library, then damage the first
    code = (
        "import asyncio\nfrom store import MessageStore, StoreOptions, Message\n"
        "async def m():\n"
        f"    s = await MessageStore.open(StoreOptions({str(data)!r}))\n"
        "    await s.put_batch([(Message('t', b'a' * 50), ['q']), (Message('t', b'b' * 50), ['q'])])\n"
        "    await s.close()\n"
        "asyncio.run(m())\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    segment = data / "commitlog" / f"{0:020d}"
    raw = bytearray(segment.read_bytes())
    raw[60] ^= 0xFF
    segment.write_bytes(bytes(raw))

    refused = tidemq(*serve_args(data))
    _, err = refused.communicate(timeout=30)
    assert refused.returncode == 3
    assert "commitlog corrupt" in err and str(segment) in err and "--repair" in err

    repaired = tidemq(*serve_args(data), "--repair")
    lines = wait_for_line(repaired, "gateway ready")
    assert any("commitlog repaired" in line and "bytes_dropped=" in line for line in lines)
    repaired.send_signal(signal.SIGTERM)
    repaired.communicate(timeout=30)
    assert repaired.returncode == 0


def test_a_replication_group_needs_its_settings_and_a_role_that_replicates():
    base = {"TIDEMQ_REPLICATION_GROUP": "g1", "TIDEMQ_ETCD_ENDPOINT": "127.0.0.1:2379"}
    with pytest.raises(ConfigError, match="role store"):
        load_config(env=base)  # (role embedded: one node, nothing to replicate)
    store = {**base, "TIDEMQ_ROLE": "store", "TIDEMQ_REMOTING_BIND": "127.0.0.1:9876", "TIDEMQ_MQTT_BIND": ""}
    with pytest.raises(ConfigError, match="node_id"):
        load_config(env=store)
    with pytest.raises(ConfigError, match="replication_bind"):
        load_config(env={**store, "TIDEMQ_NODE_ID": "s1"})
    full = {**store, "TIDEMQ_NODE_ID": "s1", "TIDEMQ_REPLICATION_BIND": "127.0.0.1:10911"}
    with pytest.raises(ConfigError, match="replication must be sync or async"):
        load_config(env={**full, "TIDEMQ_REPLICATION": "quorum"})
    with pytest.raises(ConfigError, match="etcd_endpoint"):
        load_config(env={**full, "TIDEMQ_ETCD_ENDPOINT": ""})
    cfg = load_config(env=full)
    assert (cfg.replication, cfg.min_insync_replicas, cfg.replication_lease_s) == ("sync", 2, 2.0)
    wide = {**full, "TIDEMQ_REPLICATION_BIND": "0.0.0.0:10911"}
    with pytest.raises(ConfigError, match="cluster_token"):  # (the link streams every message to whoever asks)
        load_config(env=wide)
    assert load_config(env={**wide, "TIDEMQ_CLUSTER_TOKEN": "t"}).cluster_token == "t"
    gateway = load_config(env={**base, "TIDEMQ_ROLE": "gateway"})  # (no store_address: the leader is in etcd)
    assert gateway.store_address == ""
