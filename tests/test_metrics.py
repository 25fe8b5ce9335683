"""The metrics listener: /metrics values move with real traffic over MQTT, AMQP and remoting;
/healthz and /readyz (not ready while the store's resource alarm blocks publishers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import ons


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


async def fetch(base: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(base + path) as response:
        return response.status, await response.text()


async def test_metrics_follow_traffic_of_every_protocol(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, mqtt_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0", remoting_bind="127.0.0.1:0",
                    metrics_bind="127.0.0.1:0", remoting_delay_levels="1s")
    gw = Gateway(config)
    await gw.start()
    try:
        assert gw.metrics_address is not None
        base = "http://%s:%d" % gw.metrics_address
        assert await fetch(base, "/healthz") == (200, "ok\n")
        assert (await fetch(base, "/readyz"))[0] == 200
        before = samples((await fetch(base, "/metrics"))[1])
        assert value(before, "tidemq_connections", protocol="mqtt") == 0
        assert value(before, "tidemq_messages_received_total", protocol="mqtt") == 0

        sub = PahoClient(mqtt_port(gw), "m-sub", version=MQTT_5)
        pub = PahoClient(mqtt_port(gw), "m-pub", version=MQTT_5)
        await sub.connect()
        await pub.connect()
        await sub.subscribe("metrics/t", qos=1)
        for i in range(5):
            await pub.publish("metrics/t", f"m{i}".encode(), qos=1)
        await sub.receive(5)
        amqp_port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
        ch = await conn.channel()
        await ch.declare_queue("backlog")
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"x"), "backlog")
        remoting_addr = "127.0.0.1:%d" % next(l.address[1] for l in gw.listeners if l.protocol == "remoting")
        await ons({"cmd": "send", "nameSrv": remoting_addr, "topic": "MetricsTopic",
                   "messages": [{"body": "r1"}, {"body": "r2"}]})
        await asyncio.sleep(0.3)

        after = samples((await fetch(base, "/metrics"))[1])
        assert value(after, "tidemq_connections", protocol="mqtt") == 2
        assert value(after, "tidemq_connections", protocol="amqp") == 1
        assert value(after, "tidemq_messages_received_total", protocol="mqtt") == 5
        assert value(after, "tidemq_messages_sent_total", protocol="mqtt") == 5
        assert value(after, "tidemq_messages_received_total", protocol="amqp") == 3
        assert value(after, "tidemq_messages_received_total", protocol="remoting") == 2
        assert value(after, "tidemq_bytes_received_total", protocol="mqtt") > 0
        assert value(after, "tidemq_amqp_queue_messages", queue="backlog") == 3
        assert value(after, "tidemq_store_put_latency_seconds_count") >= 10
        assert value(after, "tidemq_store_put_latency_seconds_bucket", le="+Inf") == \
            value(after, "tidemq_store_put_latency_seconds_count")
        assert value(after, "tidemq_queues") >= 3
        assert value(after, "tidemq_notify_events_total") > value(before, "tidemq_notify_events_total")
        assert value(after, "tidemq_commitlog_bytes") > 0
        assert value(after, "tidemq_store_memtable_bytes") > 0  # (the puts above are in them)
        assert value(after, "tidemq_store_block_cache_bytes") >= 0
        await conn.close()
        await pub.disconnect()
        await sub.disconnect()

        gw.pressure.disk_free_limit = 1 << 62  # the resource alarm: not ready
        for _ in range(50):
            if gw.pressure.raised:
                break
            await asyncio.sleep(0.05)
        status, text = await fetch(base, "/readyz")
        assert status == 503 and "blocked" in text
        assert value(samples((await fetch(base, "/metrics"))[1]), "tidemq_resource_alarm") == 1
    finally:
        await gw.stop()


async def test_timer_metrics_count_pending_and_released_timer_messages(data_dir: Path) -> None:
    config = Config(data_dir=data_dir, mqtt_bind="127.0.0.1:0", amqp_bind="", remoting_bind="",
                    metrics_bind="127.0.0.1:0")
    gw = Gateway(config)
    await gw.start()
    try:
        base = "http://%s:%d" % gw.metrics_address
        pub = PahoClient(mqtt_port(gw), "t-pub", version=MQTT_5)
        await pub.connect()
        await pub.publish("$delayed/1/timer/t", b"soon", qos=1)
        await pub.publish("$delayed/3600/timer/t", b"in an hour", qos=1)
        metrics = samples((await fetch(base, "/metrics"))[1])
        assert value(metrics, "tidemq_timer_pending") == 2
        assert value(metrics, "tidemq_timer_due_within", seconds="2") == 1
        assert value(metrics, "tidemq_timer_due_within", seconds="3600") == 2
        for _ in range(100):
            metrics = samples((await fetch(base, "/metrics"))[1])
            if value(metrics, "tidemq_timer_released_total") == 1:
                break
            await asyncio.sleep(0.05)
        assert value(metrics, "tidemq_timer_pending") == 1
        assert value(metrics, "tidemq_timer_due_lag_seconds_count") == 1
        await pub.disconnect()
    finally:
        await gw.stop()
