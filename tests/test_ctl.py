"""``tidemq ctl`` (a real subprocess) against a running gateway's admin API: clients,
subscriptions, queues, query by key and by message id (the store's and a RocketMQ client's),
kick, trace, the admin token and an admin user's credentials, options after the command."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from rocketmq import client as rmq

from gateway.auth import PasswordFile
from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway
from tests.remoting_support import ons, remoting_gateway
from tests.test_amqp import get

TOKEN = "s3cret"


def keyed(key: str) -> PahoProperties:
    props = PahoProperties(PacketTypes.PUBLISH)
    props.UserProperty = ("key", key)
    return props


async def ctl(url: str, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "ctl", "--url", url, "--token", token, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_ctl_lists_queries_and_kicks(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, mqtt_bind="127.0.0.1:0", amqp_bind="", remoting_bind="127.0.0.1:0",
                    metrics_bind="127.0.0.1:0", admin_token=TOKEN)
    gw = Gateway(config)
    await gw.start()
    try:
        url = "http://%s:%d" % gw.metrics_address
        device = PahoClient(mqtt_port(gw), "dev-1", version=MQTT_5)
        await device.connect()
        await device.subscribe("ctl/t", qos=1)
        keyed = PahoProperties(PacketTypes.PUBLISH)
        keyed.UserProperty = ("key", "reading-7")
        await device.publish("ctl/t", b"hello", qos=1, properties=keyed)
        await device.receive(1)
        remoting = "127.0.0.1:%d" % next(l.address[1] for l in gw.listeners if l.protocol == "remoting")
        await ons({"cmd": "send", "nameSrv": remoting, "topic": "CtlTopic",
                   "messages": [{"body": "order body", "keys": ["order-9"]}]})

        code, out, _ = await ctl(url, "--json", "clients")
        assert code == 0 and {"protocol": "mqtt", "id": "dev-1"}.items() <= json.loads(out)[0].items()
        code, out, _ = await ctl(url, "subscriptions")  # a table
        assert code == 0 and "ctl/t" in out and out.splitlines()[0].split()[:2] == ["protocol", "client"]
        code, out, _ = await ctl(url, "--json", "queues", "--prefix", "t:ctl/")
        assert code == 0 and [(q["queue"], q["stored"], q["readers"]) for q in json.loads(out)] == [("t:ctl/t", 1, 1)]

        code, out, _ = await ctl(url, "--json", "query", "--key", "order-9", "--topic", "CtlTopic")
        found = json.loads(out)
        assert code == 0 and [m["body"] for m in found] == ["order body"]
        code, out, _ = await ctl(url, "--json", "query", "--key", "reading-7", "--topic", "ctl/t")
        assert code == 0 and [m["body"] for m in json.loads(out)] == ["hello"]  # an MQTT 5 user property "key"
        code, out, _ = await ctl(url, "--json", "query", "--msg-id", found[0]["msg_id"])
        assert code == 0 and json.loads(out)[0]["position"] == found[0]["position"]

        code, _, err = await ctl(url, "clients", token="wrong")
        assert code == 1 and "401" in err
        code, _, err = await ctl(url, "kick", "mqtt", "nobody")
        assert code == 1 and "404" in err
        code, out, _ = await ctl(url, "kick", "mqtt", "dev-1", "--json")
        assert code == 0 and json.loads(out) == {"kicked": "dev-1"}
        reason = await asyncio.to_thread(device.disconnects.get, True, 5)
        assert reason == 0x98  # DISCONNECT: administrative action
    finally:
        await gw.stop()


async def test_ctl_says_when_the_gateway_is_not_there() -> None:
    code, _, err = await ctl("http://127.0.0.1:9", "clients")
    assert code == 1 and "cannot reach" in err


async def test_ctl_queues_shows_stored_and_backlog_and_forgets_deleted_amqp_queues(data_dir: Path) -> None:
    """`ctl queues`: `stored` entries and, for AMQP queues, the `backlog` (the store's max offset
    minus the queue's consumer offset); an AMQP queue deleted before a restart is not listed."""
    config = Config(data_dir=data_dir, mqtt_bind="", amqp_bind="127.0.0.1:0", remoting_bind="",
                    metrics_bind="127.0.0.1:0", admin_token=TOKEN)
    gw = Gateway(config)
    await gw.start()
    try:
        amqp_port = next(l.address[1] for l in gw.listeners if l.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        channel = await conn.channel()
        keep = await channel.declare_queue("keep", durable=True)
        gone = await channel.declare_queue("gone", durable=True)
        for body in (b"1", b"2", b"3"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key="keep")
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="gone")
        first = await get(keep)
        await first.ack()
        await gone.delete(if_unused=False, if_empty=False)
        await conn.close()
    finally:
        await gw.stop()
    gw = Gateway(config)
    await gw.start()
    try:
        url = "http://%s:%d" % gw.metrics_address
        code, out, err = await ctl(url, "--json", "queues", "--prefix", "q:")
        assert code == 0, err
        assert [(q["queue"], q["stored"], q["backlog"]) for q in json.loads(out)] == [("q:keep", 3, 2)]
        code, out, _ = await ctl(url, "queues", "--prefix", "q:")
        assert out.splitlines()[0].split() == ["queue", "min_offset", "max_offset", "stored", "backlog", "readers"]
    finally:
        await gw.stop()


async def test_ctl_query_exits_non_zero_when_nothing_is_found(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="",
                    metrics_bind="127.0.0.1:0", admin_token=TOKEN)
    gw = Gateway(config)
    await gw.start()
    try:
        url = "http://%s:%d" % gw.metrics_address
        code, out, err = await ctl(url, "query", "--msg-id", "zzz")
        assert code == 2 and "zzz" in err and "32 hex digits" in err and out == "", (code, out, err)
        code, _, err = await ctl(url, "trace", "--msg-id", "zzz")
        assert code == 2 and "32 hex digits" in err, err
        unknown = gw.store.msg_id_prefix + "0000000000ABCDEF"
        code, out, err = await ctl(url, "query", "--msg-id", unknown)
        assert code == 1 and f"no message with id {unknown}" in err and out == "", (code, out, err)
        code, out, err = await ctl(url, "--json", "query", "--key", "k", "--topic", "t")
        assert code == 1 and json.loads(out) == [] and "no message with key 'k' in topic 't'" in err
    finally:
        await gw.stop()


async def test_ctl_into_a_closed_pipe_ends_quietly(data_dir: Path) -> None:
    """`tidemq ctl ... | head -1`: the reader goes away before the output is written."""
    config = Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="",
                    metrics_bind="127.0.0.1:0")
    gw = Gateway(config)
    await gw.start()
    try:
        url = "http://%s:%d" % gw.metrics_address
        read_end, write_end = os.pipe()
        os.close(read_end)  # before ctl writes a byte
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "ctl", "--url", url, "--json", "queues",
            stdout=write_end, stderr=asyncio.subprocess.PIPE)
        os.close(write_end)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert err.decode() == "" and proc.returncode == 141, err.decode()  # as a tool killed by SIGPIPE
    finally:
        await gw.stop()


async def run_ctl(url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`tidemq ctl` with only the credentials given here (no --token of its own)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "ctl", "--url", url, *args, env={**clean, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_ctl_passes_a_users_credentials_and_takes_its_options_after_the_command(data_dir: Path,
                                                                                      tmp_path: Path) -> None:
    users = PasswordFile()
    for name in ("alice", "root"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", password_file=str(tmp_path / "passwd"),
                               allow_anonymous=False, admin_users="root") as gw:
        url = "http://%s:%d" % gw.metrics_address
        code, _, err = await run_ctl(url, "clients")
        assert code == 1 and "401" in err and "--user" in err and "--token" in err, err
        code, out, err = await run_ctl(url, "--user", "root", "--password", "pw-root", "clients")
        assert code == 0 and out.strip() == "(none)", err
        code, out, err = await run_ctl(url, "sessions", "--user", "root", "--password", "pw-root", "--json")
        assert code == 0 and json.loads(out) == [], err
        code, out, err = await run_ctl(url, "sessions", "--json",
                                       env={"TIDEMQ_ADMIN_USER": "root", "TIDEMQ_ADMIN_PASSWORD": "pw-root"})
        assert code == 0 and json.loads(out) == [], err
        code, _, err = await run_ctl(url, "clients", "--user", "alice", "--password", "pw-alice")
        assert code == 1 and "403" in err and "admin_users" in err, err
        code, _, err = await run_ctl(url, "clients", "--user", "root", "--password", "wrong")
        assert code == 1 and "401" in err, err


async def test_ctl_prints_tables_for_kick_and_says_why_a_trace_is_empty(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        url = "http://%s:%d" % gw.metrics_address
        device = PahoClient(mqtt_port(gw), "dev-1", version=MQTT_5)
        await device.connect()
        await device.publish("ctl/t", b"x", qos=1, properties=keyed("k-1"))
        code, out, err = await run_ctl(url, "kick", "mqtt", "dev-1")
        assert code == 0 and out.split() == ["kicked", "dev-1"], (out, err)  # a table, as every command
        code, out, err = await run_ctl(url, "kick", "mqtt", "dev-1", "--json")
        assert code == 1 and "404" in err
        code, out, err = await run_ctl(url, "trace", "--key", "k-1")
        assert code == 1 and out == "", out
        assert "message trace is off" in err and "--trace" in err and "TIDEMQ_TRACE" in err, err
        code, out, err = await run_ctl(url, "trace", "--key", "k-1", "--json")
        assert code == 1 and json.loads(out) == [] and "message trace is off" in err


async def test_ctl_tables_show_times_as_iso_and_json_keeps_milliseconds(data_dir: Path) -> None:
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="mqtt") as gw:
        url = "http://%s:%d" % gw.metrics_address
        device = PahoClient(mqtt_port(gw), "dev-1", version=MQTT_5)
        await device.connect()
        await device.publish("ctl/t", b"x", qos=1, properties=keyed("k-1"))
        await device.disconnect()
        assert gw.tracer is not None
        await gw.tracer.flush()
        code, out, err = await run_ctl(url, "trace", "--key", "k-1", "--json")
        events = json.loads(out)
        assert code == 0 and [e["type"] for e in events] == ["publish", "store"], err
        assert all(isinstance(e["time"], (int, float)) and e["time"] > 1.7e12 for e in events)
        code, out, err = await run_ctl(url, "trace", "--key", "k-1")
        header, *rows = out.splitlines()
        column = header.split().index("time")
        iso = datetime.fromtimestamp(events[0]["time"] / 1000, UTC).isoformat(timespec="milliseconds")
        assert rows[0].split()[column] == iso.replace("+00:00", "Z"), out
        code, out, err = await run_ctl(url, "query", "--key", "k-1", "--topic", "ctl/t")
        header, row = out.splitlines()
        stored = row.split()[header.split().index("store_timestamp")]
        assert code == 0 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stored), out


@pytest.mark.usefixtures("rocketmq_home")
async def test_ctl_finds_a_message_by_the_msgid_its_rocketmq_client_printed(data_dir: Path) -> None:
    """RocketMQ clients print the id they made themselves (UNIQ_KEY), not the broker's offsetMsgId:
    `query --msg-id` and `trace --msg-id` (so /admin/messages and /admin/trace) take both."""
    async with remoting_gateway(data_dir, metrics_bind="127.0.0.1:0", trace="remoting") as (gw, addr):
        url = "http://%s:%d" % gw.metrics_address
        producer = rmq.Producer("PID-ctl")
        producer.set_namesrv_addr(addr)
        await asyncio.to_thread(producer.start)
        try:
            sent = rmq.Message("CtlOrders")
            sent.set_body("order body")
            sent.set_keys("order-1")
            result = await asyncio.to_thread(producer.send_sync, sent)
        finally:
            await asyncio.to_thread(producer.shutdown)
        [stored] = gw.store.query_by_key("CtlOrders", "order-1")
        client_id = result.msg_id
        assert client_id != stored.msg_id and len(client_id) == 32  # the client's own id, as it printed it
        assert gw.tracer is not None
        await gw.tracer.flush()
        for msg_id in (client_id, stored.msg_id, client_id.lower()):
            code, out, err = await run_ctl(url, "query", "--msg-id", msg_id, "--json")
            assert code == 0, err
            assert [(m["msg_id"], m["body"]) for m in json.loads(out)] == [(stored.msg_id, "order body")]
            code, out, err = await run_ctl(url, "trace", "--msg-id", msg_id, "--json")
            assert code == 0 and "publish" in [e["type"] for e in json.loads(out)], (out, err)
        code, out, err = await run_ctl(url, "query", "--msg-id", client_id, "--topic", "CtlOrders", "--json")
        assert code == 0 and [m["body"] for m in json.loads(out)] == ["order body"], err
        code, out, err = await run_ctl(url, "query", "--msg-id", client_id, "--topic", "Elsewhere")
        assert code == 1 and "no message with id" in err


async def test_ctl_queues_pages_and_says_when_the_listing_was_cut(data_dir: Path) -> None:
    """`ctl queues`: a page of `--limit` queues, a note on stderr where a cut listing goes on
    (`--after`), `$` topics' queues (presence events) only with a prefix that names them, and a
    limit beyond a page refused rather than cut silently."""
    config = Config(data_dir=data_dir, mqtt_bind="127.0.0.1:0", amqp_bind="", remoting_bind="",
                    metrics_bind="127.0.0.1:0", admin_token=TOKEN)
    gw = Gateway(config)
    await gw.start()
    try:
        url = "http://%s:%d" % gw.metrics_address
        device = PahoClient(mqtt_port(gw), "dev-1")
        await device.connect()  # (its presence event: in the queue of w:$SYS/brokers/+/clients/+/+)
        for i in range(5):
            await device.publish(f"u/{i}", b"x", qos=1)
        await device.disconnect()

        code, out, err = await ctl(url, "--json", "queues", "--prefix", "t:", "--limit", "2")
        assert code == 0 and [q["queue"] for q in json.loads(out)] == ["t:u/0", "t:u/1"], (out, err)
        assert "cut after 2 queues" in err and "--after 't:u/1'" in err
        code, out, err = await ctl(url, "--json", "queues", "--prefix", "t:", "--after", "t:u/1", "--limit", "3")
        assert code == 0 and [q["queue"] for q in json.loads(out)] == ["t:u/2", "t:u/3", "t:u/4"] and err == ""
        code, out, _ = await ctl(url, "--json", "queues", "--prefix", "w:$")
        assert code == 0 and json.loads(out) and all(q["queue"].startswith("w:$SYS/") for q in json.loads(out))
        code, out, err = await ctl(url, "queues", "--limit", "5000")
        assert code == 2 and "limit must be 1 to 1000" in err and out == ""
    finally:
        await gw.stop()


def test_ctl_asked_for_a_password_and_given_none_says_so_without_a_traceback() -> None:
    """`tidemq ctl --user root clients` on a terminal, answered with Ctrl-D (end of input)."""
    import pty
    import subprocess

    controller, terminal = pty.openpty()
    try:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
        proc = subprocess.Popen(  # a session of its own: no /dev/tty, so getpass reads the pty
            [sys.executable, "-m", "gateway", "ctl", "--url", "http://127.0.0.1:9", "--user", "root", "clients"],
            stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean, start_new_session=True)
        os.close(terminal)
        assert proc.stderr is not None
        prompt = b""
        while b"password of root" not in prompt:  # (getpass prompts on stderr without a /dev/tty)
            prompt += proc.stderr.read1(100) or pytest.fail(f"no prompt: {prompt!r}")
        os.write(controller, b"\x04")  # Ctrl-D: the end of input
        _, rest = proc.communicate(timeout=30)
        err = prompt + rest
    finally:
        os.close(controller)
    assert proc.returncode == 1 and "Traceback" not in err.decode(), err.decode()
    assert "no password" in err.decode(), err.decode()


async def test_ctl_rules_creates_lists_pauses_resumes_changes_and_deletes(data_dir: Path, tmp_path: Path) -> None:
    definition = tmp_path / "rule.json"
    definition.write_text(json.dumps({"sources": ["sensors/#"], "targets": [{"type": "topic", "topic": "out/all"}]}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sources": ["sensors/#"], "pattern": {"data": {"t": [{"numeric": [">", 5, "<", 1]}]}},
                               "targets": [{"type": "topic", "topic": "out/all"}]}))
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        host, port = gw.metrics_address
        url = f"http://{host}:{port}"
        code, out, err = await ctl(url, "rules", "create", "copy", "--file", str(definition))
        assert code == 0, err
        code, out, err = await ctl(url, "rules", "create", "broken", "--file", str(bad))
        assert code == 2 and "$.pattern.data.t[0].numeric[3]" in err, err
        code, out, _ = await ctl(url, "rules")  # list, as a table
        header, row = out.splitlines()
        assert header.split() == ["name", "state", "sources", "targets", "matched", "delivered", "retried",
                                  "dead_lettered", "lag", "target_latency_ms", "last_error"]
        assert row.split()[:2] == ["copy", "running"]
        code, out, _ = await ctl(url, "rules", "pause", "copy", "--json")
        assert code == 0 and json.loads(out)["state"] == "paused"
        code, out, _ = await ctl(url, "rules", "resume", "copy", "--json")
        assert code == 0 and json.loads(out)["state"] == "running"
        definition.write_text(json.dumps({"sources": ["sensors/#"], "targets": [{"type": "topic", "topic": "out/b"}]}))
        code, out, _ = await ctl(url, "rules", "change", "copy", "--file", str(definition), "--json")
        assert code == 0 and json.loads(out)["targets"] == ["topic:out/b"]
        code, out, _ = await ctl(url, "rules", "show", "copy", "--json")
        assert json.loads(out)["definition"]["targets"] == [{"type": "topic", "topic": "out/b"}]
        code, _, err = await ctl(url, "rules", "delete", "copy")
        assert code == 0
        code, _, err = await ctl(url, "rules", "show", "copy")
        assert code == 1 and "404" in err
        code, _, err = await ctl(url, "rules", "list", token="wrong")
        assert code == 1 and "401" in err
