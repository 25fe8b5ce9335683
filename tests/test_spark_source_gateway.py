"""The ``tidemq`` Spark source against a live gateway. A gateway process that goes away and comes
back: a streaming query waits for it (retrying with backoff) and goes on with nothing lost or
read twice; an unreachable gateway fails a query only after ``retryTimeoutMs``, each retry
logged. A stream on a topicFilter nobody subscribes to holds the filter itself
(``POST /data/filters``), so its wildcard queue gets every message from the query's start."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from bridge.data_client import HttpClient, SourceError, close_clients
from tests.crash_support import launch, stop
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway

TOPIC = "plant/line1/telemetry"
QUEUE = "t:" + TOPIC


def free_ports(count: int) -> list[int]:
    """Ports free now, distinct (all bound at once while they are picked)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_gateway(data_dir: Path, mqtt: int, metrics: int) -> subprocess.Popen:
    """A gateway process with the data API (sync flush: an acknowledged publish is on disk)."""
    return launch(["--data-dir", str(data_dir), "--mqtt-bind", f"127.0.0.1:{mqtt}", "--metrics-bind",
                   f"127.0.0.1:{metrics}", "--amqp-bind", "", "--remoting-bind", "", "--flush", "sync"])


async def publish(port: int, first: int, count: int) -> None:
    pub = PahoClient(port, f"pub-{first}")
    await pub.connect()
    for i in range(first, first + count):
        await pub.publish(TOPIC, b"%d" % i, qos=1)
    await pub.disconnect()


def test_unreachable_gateway_is_retried_with_backoff_then_fails(caplog) -> None:
    client = HttpClient(f"http://127.0.0.1:{free_ports(1)[0]}", retry_timeout_s=1.5)
    with caplog.at_level(logging.WARNING, logger="tidemq.spark"), pytest.raises(SourceError) as failed:
        client.offsets([QUEUE])
    assert "cannot reach the gateway" in str(failed.value) and "retryTimeoutMs" in str(failed.value)
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 3, retries  # 0.25 + 0.5 + 0.75 s of waits at least
    assert all("attempt=" in m and "cannot reach the gateway" in m for m in retries)


async def test_streaming_query_survives_a_gateway_restart(spark, tmp_path: Path) -> None:
    data_dir, ckpt = tmp_path / "data", tmp_path / "ckpt"
    mqtt, metrics = free_ports(2)
    seen: list[int] = []

    def each(batch, batch_id: int) -> None:
        seen.extend(int(r.payload) for r in batch.select("payload").collect())

    def wait_for(count: int, query) -> None:
        deadline = time.monotonic() + 90
        while len(seen) < count:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"{len(seen)} of {count} rows"
            time.sleep(0.1)

    proc = start_gateway(data_dir, mqtt, metrics)
    query = None
    try:
        await publish(mqtt, 0, 40)
        query = await asyncio.to_thread(lambda: (
            spark.readStream.format("tidemq").option("address", f"127.0.0.1:{metrics}").option("queues", QUEUE)
            .option("startingOffsets", "earliest").load()
            .writeStream.foreachBatch(each).trigger(processingTime="200 milliseconds")
            .option("checkpointLocation", str(ckpt)).start()))
        await asyncio.to_thread(wait_for, 40, query)
        stop(proc)
        await asyncio.sleep(6)  # longer than the query used to live without its gateway (4 s)
        assert query.isActive, query.exception()
        proc = start_gateway(data_dir, mqtt, metrics)
        await publish(mqtt, 40, 40)
        await asyncio.to_thread(wait_for, 80, query)
        assert query.isActive, query.exception()
    finally:
        if query is not None:
            await asyncio.to_thread(query.stop)
        stop(proc)
    assert sorted(seen) == list(range(80))  # each once


FILTER = "fleet/+/status"
WILDCARD = "w:" + FILTER


def held(gw, topic_filter: str) -> bool:
    """Does a publish to a topic matching ``topic_filter`` go to its wildcard queue?"""
    return "w:" + topic_filter in gw.mqtt.wildcards.queues_for(topic_filter.replace("+", "x").replace("#", "x"))


async def publish_to(gw, topic: str, count: int) -> None:
    pub = PahoClient(mqtt_port(gw), "holder-pub")
    await pub.connect()
    for i in range(count):
        await pub.publish(topic, b"%d" % i, qos=1)
    await pub.disconnect()


async def test_data_api_holds_a_filter_across_a_restart_until_its_lease_lapses(data_dir: Path) -> None:
    async def post(gw, body) -> tuple[int, dict]:
        url = "http://{}:{}/data/filters".format(*gw.metrics_address)
        async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
            return response.status, await response.json()

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        assert not held(gw, FILTER)
        assert await post(gw, {"topicFilter": FILTER, "lease_ms": 600_000}) == (
            200, {"topicFilter": FILTER, "queue": WILDCARD, "held": True})
        assert held(gw, FILTER)
        await publish_to(gw, "fleet/a/status", 3)  # nobody subscribes: indexed for the reader anyway
        assert gw.store.index.lookup(WILDCARD).next_offset == 3
        assert (await post(gw, {"topicFilter": "fleet/a/status"}))[1]["held"] is False  # a topic queue
        for bad in ({"topicFilter": "a/#/b"}, {"topicFilter": FILTER, "lease_ms": 5}, {"lease_ms": 1000}, []):
            status, answer = await post(gw, bad)
            assert status == 400 and answer["error"], (bad, answer)
        assert (await post(gw, {"topicFilter": "brief/#", "lease_ms": 300}))[0] == 200
        assert held(gw, "brief/#")
        deadline = time.monotonic() + 10
        while held(gw, "brief/#"):  # the lease lapses: the filter is no longer indexed
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert held(gw, FILTER)

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:  # restored from the store
        assert held(gw, FILTER) and not held(gw, "brief/#")
        await publish_to(gw, "fleet/b/status", 2)
        assert gw.store.index.lookup(WILDCARD).next_offset == 5


async def test_stream_of_a_filter_nobody_subscribes_to_reads_from_its_start(spark, data_dir: Path,
                                                                            tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []

    def each(batch, batch_id: int) -> None:
        seen.extend((r.offset, r.topic) for r in batch.select("offset", "topic").collect())

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0") as gw:
        query = await asyncio.to_thread(lambda: (
            spark.readStream.format("tidemq").option("address", "{}:{}".format(*gw.metrics_address))
            .option("topicFilter", FILTER).load()  # startingOffsets: latest
            .writeStream.foreachBatch(each).trigger(processingTime="200 milliseconds")
            .option("checkpointLocation", str(tmp_path / "ckpt")).start()))
        try:
            # (a streaming query's start and first batches: 13 s here alone, 23-35 s with both cores
            # busy, over 60 s once in a whole-suite CI run; 120 s as the other streaming tests)
            deadline = time.monotonic() + 120
            while not held(gw, FILTER):  # the query holds its filter from its start
                assert query.isActive and time.monotonic() < deadline, query.exception()
                await asyncio.sleep(0.1)
            await publish_to(gw, "fleet/c/status", 10)
            while len(seen) < 10:
                assert query.isActive and time.monotonic() < deadline, query.exception()
                await asyncio.sleep(0.1)
        finally:
            await asyncio.to_thread(query.stop)
    assert sorted(seen) == [(i, "fleet/c/status") for i in range(10)]


async def test_data_dir_stream_of_an_unheld_filter_says_nothing_will_come(data_dir: Path, caplog) -> None:
    """With dataDir the source cannot hold the filter: it warns, naming the filter (what
    initialOffset runs on the driver's side; nothing is subscribed)."""
    from bridge.spark_options import SourceOptions
    from bridge.spark_source import TideMQStreamReader

    async with running_gateway(data_dir) as gw:
        await asyncio.to_thread(gw.store.index.flush)
        reader = TideMQStreamReader(SourceOptions.parse({"dataDir": str(data_dir), "topicFilter": FILTER}))
        with caplog.at_level(logging.WARNING, logger="tidemq.spark"):
            assert await asyncio.to_thread(reader.initialOffset) == {WILDCARD: 0}
        reader.stop()
        close_clients()
    assert f"topicFilter '{FILTER}'" in caplog.text and "until an MQTT client subscribes" in caplog.text
