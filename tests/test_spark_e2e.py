"""End to end: paho devices publish telemetry to a real gateway -> the telemetry_agg job
(``spark_sinks/jobs/telemetry_agg.py``, on the shared local[2] session) -> Parquet aggregates
equal to the ones computed here from what was published, and alerts received by an MQTT
subscriber, each exactly once, across a stop mid-stream and a re-run micro-batch."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import aiohttp

from spark_sinks.jobs.telemetry_agg import JobConfig, start
from tests.mqtt_support import PahoClient, mqtt_port, running_gateway
from tests.spark_support import activate

BASE = 1_767_225_600.0  # 2026-01-01T00:00:00Z: event times of the readings
DEVICES = 4
THRESHOLD = 30.0


def reading(i: int) -> tuple[str, dict]:
    """Reading i: device d{i % 4}, every 2 s of event time, temperatures 18..35."""
    return f"devices/d{i % DEVICES}/telemetry", {"ts": BASE + 2 * i, "temp": 18 + (i * 7) % 18}


async def publish(pub: PahoClient, first: int, count: int, sent: list[dict]) -> None:
    for i in range(first, first + count):
        topic, body = reading(i)
        await pub.publish(topic, json.dumps(body), qos=1)
        sent.append({"device": topic.split("/")[1], **body})


def expected_aggregates(sent: list[dict], watermark: float) -> dict[tuple, tuple]:
    """(device, window start) -> (min, avg, max, count) of the 1-minute windows the watermark closed."""
    windows: dict[tuple, list[float]] = defaultdict(list)
    for r in sent:
        windows[(r["device"], math.floor(r["ts"] / 60) * 60)].append(r["temp"])
    return {key: (min(v), sum(v) / len(v), max(v), len(v)) for key, v in windows.items() if key[1] + 60 <= watermark}


def drop_last_commit(checkpoint: Path) -> bool:
    """As if the query had crashed after its sink wrote the last micro-batch and before Spark
    recorded it as done: a restart runs that batch again. False when the stop interrupted a
    batch (it raced a trigger): that batch runs again anyway."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    if last != max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()):
        return False
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return True


def test_the_job_has_a_command_line() -> None:
    out = subprocess.run([sys.executable, "-m", "spark_sinks.jobs.telemetry_agg", "--help"], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert "--address" in out and "--threshold" in out and "available-now" in out


async def test_telemetry_to_parquet_aggregates_and_mqtt_alerts_across_a_restart(spark, tmp_path: Path) -> None:
    async with running_gateway(tmp_path / "data", metrics_bind="127.0.0.1:0") as gw:
        port = mqtt_port(gw)
        alerts = PahoClient(port, "alerts-app")
        await alerts.connect()
        await alerts.subscribe("alerts/#", qos=1)
        pub = PahoClient(port, "devices")
        await pub.connect()
        sent: list[dict] = []
        await publish(pub, 0, 100, sent)
        for junk in (b"garbage", b'{"temp": "hot"}', b""):  # undecodable: left out, not fatal
            await pub.publish("devices/d1/telemetry", junk, qos=1)

        cfg = JobConfig(address="{}:{}".format(*gw.metrics_address), checkpoint=str(tmp_path / "ckpt"),
                        output=str(tmp_path / "out"), threshold=THRESHOLD, trigger="2 seconds",
                        max_offsets_per_trigger=40)

        def first_run() -> list[int]:
            activate(spark)
            queries = start(spark, cfg)
            deadline = time.monotonic() + 120
            running = list(queries)
            while running:  # stop each query between two micro-batches, after two with data
                assert time.monotonic() < deadline, [q.recentProgress for q in queries]
                assert all(q.isActive for q in running), [q.exception() for q in running]
                for q in list(running):
                    if len([p for p in q.recentProgress if p["numInputRows"]]) >= 2 and not q.status["isTriggerActive"]:
                        q.stop()
                        running.remove(q)
                time.sleep(0.02)
            return [sum(p["numInputRows"] for p in q.recentProgress) for q in queries]

        done = await asyncio.to_thread(first_run)
        assert all(80 <= n <= 103 for n in done), done  # 103 readings, at most 40 a micro-batch
        # a crash after the sinks wrote the last batch: it runs again
        rerun = [drop_last_commit(tmp_path / "ckpt" / name) for name in ("aggregates", "alerts")]
        await publish(pub, 100, 80, sent)  # the devices go on while the job is down
        sentinel = {"ts": BASE + 3600, "temp": 0.0}  # pushes the watermark past every window above
        await pub.publish("devices/d0/telemetry", json.dumps(sentinel), qos=1)

        def second_run() -> list:
            activate(spark)
            # what is left in one micro-batch, after the re-run one (Spark re-runs it as planned)
            queries = start(spark, replace(cfg, trigger="available-now", max_offsets_per_trigger=None))
            for q in queries:
                assert q.awaitTermination(120), f"{q.name} still running"
                assert q.exception() is None, q.exception()
            return spark.read.parquet(cfg.output).collect()

        rows = await asyncio.to_thread(second_run)
        got = {(r.device, r.window_start.timestamp()): (r["min"], r["avg"], r["max"], r["count"]) for r in rows}
        assert len(rows) == len(got)  # one row per device and window: nothing twice
        want = expected_aggregates(sent, sentinel["ts"] - 120)
        assert got.keys() == want.keys() and len(want) == DEVICES * 6  # 360 s of readings: 6 windows each
        for key, (lo, avg, hi, n) in want.items():
            assert got[key][0] == lo and got[key][2] == hi and got[key][3] == n, key
            assert math.isclose(got[key][1], avg), key
        assert all(r.window_end.timestamp() - r.window_start.timestamp() == 60 for r in rows)

        hot = [r for r in sent if r["temp"] > THRESHOLD]
        received = await alerts.receive(len(hot), timeout=15)
        await alerts.nothing_more(1.0)
        assert sorted((m.topic, json.loads(m.payload)["temp"], json.loads(m.payload)["ts"]) for m in received) == \
            sorted((f"alerts/{r['device']}", r["temp"], r["ts"]) for r in hot)
        first = json.loads(received[0].payload)
        assert first["threshold"] == THRESHOLD and first["queue"] == f"t:devices/{first['device']}/telemetry"
        assert all(m.qos == 1 for m in received)
        # the re-run batch's alerts were answered from their keys, not stored again
        url = "http://{}:{}/metrics".format(*gw.metrics_address)
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            metrics = await response.text()
        [duplicates] = [float(line.split()[1]) for line in metrics.splitlines()
                        if line.startswith("tidemq_data_publish_duplicates_total ")]
        assert duplicates >= 1 or not rerun[1], metrics
        await asyncio.gather(pub.disconnect(), alerts.disconnect())

