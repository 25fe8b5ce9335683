"""The ``tidemq`` Spark source against a gateway process that goes away and comes back: a
streaming query waits for it (retrying with backoff) and goes on with nothing lost or read twice;
an unreachable gateway fails a query only after ``retryTimeoutMs``, each retry logged."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_sinks.client import HttpClient, SourceError
from tests.mqtt_support import PahoClient

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "plant/line1/telemetry"
QUEUE = "t:" + TOPIC


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(data_dir: Path, mqtt: int, metrics: int) -> subprocess.Popen:
    """A gateway process with the data API (sync flush: an acknowledged publish is on disk)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(data_dir), "--mqtt-bind", f"127.0.0.1:{mqtt}",
         "--metrics-bind", f"127.0.0.1:{metrics}", "--amqp-bind", "", "--remoting-bind", "", "--flush", "sync"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "gateway ready" in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError("gateway did not start")


def stop_gateway(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def publish(port: int, first: int, count: int) -> None:
    pub = PahoClient(port, f"pub-{first}")
    await pub.connect()
    for i in range(first, first + count):
        await pub.publish(TOPIC, b"%d" % i, qos=1)
    await pub.disconnect()


def test_unreachable_gateway_is_retried_with_backoff_then_fails(caplog) -> None:
    client = HttpClient(f"http://127.0.0.1:{free_port()}", retry_timeout_s=1.5)
    with caplog.at_level(logging.WARNING, logger="tidemq.spark"), pytest.raises(SourceError) as failed:
        client.offsets([QUEUE])
    assert "cannot reach the gateway" in str(failed.value) and "retryTimeoutMs" in str(failed.value)
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 3, retries  # 0.25 + 0.5 + 0.75 s of waits at least
    assert all("attempt=" in m and "cannot reach the gateway" in m for m in retries)


async def test_streaming_query_survives_a_gateway_restart(spark, tmp_path: Path) -> None:
    data_dir, ckpt = tmp_path / "data", tmp_path / "ckpt"
    mqtt, metrics = free_port(), free_port()
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
        stop_gateway(proc)
        await asyncio.sleep(6)  # longer than the query used to live without its gateway (4 s)
        assert query.isActive, query.exception()
        proc = start_gateway(data_dir, mqtt, metrics)
        await publish(mqtt, 40, 40)
        await asyncio.to_thread(wait_for, 80, query)
        assert query.isActive, query.exception()
    finally:
        if query is not None:
            await asyncio.to_thread(query.stop)
        stop_gateway(proc)
    assert sorted(seen) == list(range(80))  # each once
