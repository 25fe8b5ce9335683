"""``tidemq ctl`` (a real subprocess) against a running gateway's admin API: clients,
subscriptions, queues, query by key and by message id, kick, and the admin token."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aio_pika
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import ons
from tests.test_amqp import get

TOKEN = "s3cret"


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
        code, out, _ = await ctl(url, "kick", "mqtt", "dev-1")
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
        await device.connect()  # (its presence event: a queue of t:$SYS/...)
        for i in range(5):
            await device.publish(f"u/{i}", b"x", qos=1)
        await device.disconnect()

        code, out, err = await ctl(url, "--json", "queues", "--prefix", "t:", "--limit", "2")
        assert code == 0 and [q["queue"] for q in json.loads(out)] == ["t:u/0", "t:u/1"], (out, err)
        assert "cut after 2 queues" in err and "--after 't:u/1'" in err
        code, out, err = await ctl(url, "--json", "queues", "--prefix", "t:", "--after", "t:u/1", "--limit", "3")
        assert code == 0 and [q["queue"] for q in json.loads(out)] == ["t:u/2", "t:u/3", "t:u/4"] and err == ""
        code, out, _ = await ctl(url, "--json", "queues", "--prefix", "t:$")
        assert code == 0 and json.loads(out) and all(q["queue"].startswith("t:$SYS/") for q in json.loads(out))
        code, out, err = await ctl(url, "queues", "--limit", "5000")
        assert code == 2 and "limit must be 1 to 1000" in err and out == ""
    finally:
        await gw.stop()
