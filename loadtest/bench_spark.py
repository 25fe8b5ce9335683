"""Spark source benchmark: 1,000,000 stored telemetry messages read by the ``tidemq`` source
(``bridge/spark_source.py``) and aggregated by a local Spark session (local[2]).

    python -m loadtest.bench_spark [--quick] [--parts source,parquet,e2e] [--records N] [--modes dataDir,address]
                                   [--aggs groupcount,count,json] [--schema pruned|full] [--e2e-readings N]
                                   [--e2e-rate R] [--trigger T] [--out FILE]

A gateway (metrics listener on a free 127.0.0.1 port) runs on a fresh temporary data dir; the
messages go straight into its store with ``put_batch`` (each indexed into its device's topic
queue ``t:devices/D/telemetry``, 1,000 devices, and the wildcard queue
``w:devices/+/telemetry``, as the gateway does for a subscribed filter), with an MQTT
publisher's properties and a ~40-byte JSON payload. The Spark job reads ``topicFilter``
``devices/+/telemetry`` -- the 1,000 topic queues, packed into partitions read on both cores
(the wildcard queue is not read) -- and aggregates per device, three ways:

    agg=groupcount: groupBy(topic).count()
    agg=count:      groupBy(topic).agg(count, sum(length(payload)), max(timestamp))
    agg=json:       the same, plus avg(temp) parsed from the JSON payload (from_json)

once per connection mode: ``dataDir`` (the data dir read directly, while the gateway runs)
and ``address`` (the gateway's /data/ read API over HTTP). The source is given the schema of
the columns each query needs (``COLUMNS``: ``topic`` for groupcount; ``topic, payload,
timestamp`` for the others), so it reads and ships only those (``bridge/pruning.py``);
``--schema full`` reads every column instead. The baseline (``--parts parquet``): the same
records, every column, written once to Parquet (untimed) in the same session, and the same
queries over it. One untimed run warms the Python workers and the JIT, then ``--runs`` (3;
``--quick``: 1) timed runs; a line gives the best::

    spark_parquet records=1000000 records_per_s=... batch_s=... cpu_s=... agg=count runs=3 partitions=2
    spark_source records=1000000 records_per_s=... batch_s=... cpu_s=... mode=dataDir agg=count runs=3
                 partitions=4 columns=topic:STRING,payload:BINARY,timestamp:TIMESTAMP vs_parquet=0.85
                 cpu_vs_parquet=0.80

``batch_s`` is the wall time of the whole job (planning, offsets, reads, aggregation, collect);
``records_per_s`` is records / batch_s; ``vs_parquet`` is the source's records_per_s over
Parquet's for the same query. ``cpu_s`` is the CPU time a run costs this process and its
children (Spark's JVM and Python workers, and in ``address`` mode the gateway, a thread here),
the mean of the timed runs; ``cpu_vs_parquet`` is Parquet's over the source's. On a shared
machine wall times swing with the neighbours' load (Parquet's own by 2x between sessions);
CPU time much less. Spark's session start-up is not counted.

End to end (``--parts e2e``): a second, fresh gateway with an MQTT listener; the example job
``spark_sinks/jobs/telemetry_agg.py`` (both queries: Parquet aggregates and alerts, on the same
local[2] session) runs with a 1 s processing-time trigger (``--trigger``); a paho client
publishes ``--e2e-readings`` readings (600; ``--quick``: 100) at ``--e2e-rate`` per second
(20), each above the threshold, and another paho client subscribed to ``alerts/#`` times each
alert from the reading's PUBLISH call to the alert's arrival. The job is warmed up first
(readings until one alert comes back -- the Python workers start with the first micro-batch --
then two more triggers for the backlog of warm-up readings to drain)::

    spark_e2e readings=600 p50_ms=... p99_ms=... max_ms=... trigger_s=1 rate_per_s=20 lost=0 duplicates=0

With a processing-time trigger a reading waits for the next trigger (up to the interval) and
then for its micro-batch (read, decode, publish through ``POST /data/publish``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from loadtest import runner
from loadtest.spark_telemetry import start_spark

DEVICES = 1000
PUT_BATCH = 20_000


class GatewayThread:
    """A gateway with its own event loop in a background thread (Spark blocks the main one)."""

    def __init__(self, data_dir: Path, mqtt_bind: str = "") -> None:
        from gateway.config import Config
        from gateway.server import Gateway

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway = Gateway(Config(data_dir=data_dir, mqtt_bind=mqtt_bind, amqp_bind="", remoting_bind="",
                                      metrics_bind="127.0.0.1:0", retention_hours=0))
        self.call(self.gateway.start())

    @property
    def mqtt_port(self) -> int:
        return next(listener.address[1] for listener in self.gateway.listeners if listener.protocol == "mqtt")

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.call(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def fill(store, records: int) -> None:
    from gateway.interop import MQTT_FLAG
    from gateway.mqtt.messages import CLIENT_ID
    from store import Message, encode_properties

    props = [encode_properties({CLIENT_ID: f"dev-{d}"}) for d in range(DEVICES)]
    topics = [f"devices/{d}/telemetry" for d in range(DEVICES)]
    targets = [[f"t:{t}", "w:devices/+/telemetry"] for t in topics]
    for first in range(0, records, PUT_BATCH):
        batch = []
        for i in range(first, min(records, first + PUT_BATCH)):
            d = i % DEVICES
            body = b'{"seq":%d,"temp":%.1f,"hum":%d}' % (i, 18 + (i * 7 % 100) / 10, 30 + i % 40)
            batch.append((Message(topics[d], body, encoded_properties=props[d], flag=MQTT_FLAG | 1), targets[d]))
        await store.put_batch(batch)


async def flush(store) -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, store.commitlog.flush)
    await loop.run_in_executor(None, store.index.flush)


# what each aggregation reads: the source is given this schema (the pruned read, bridge/pruning.py)
COLUMNS = {
    "groupcount": "topic STRING",
    "count": "topic STRING, payload BINARY, timestamp TIMESTAMP",
    "json": "topic STRING, payload BINARY, timestamp TIMESTAMP",
}


def aggregate(df, agg: str):
    """The timed query: groupcount is the issue's groupBy(topic).count(); count and json add
    payload bytes and the last store time per device, json the average of a JSON field too."""
    from pyspark.sql import functions as F

    if agg == "groupcount":
        return df.groupBy("topic").agg(F.count(F.lit(1)).alias("n"))
    columns = [F.count(F.lit(1)).alias("n"), F.sum(F.length("payload")).alias("bytes"), F.max("timestamp").alias("last")]
    if agg == "json":
        temp = F.from_json(F.col("payload").cast("string"), "temp double, hum int").getField("temp")
        columns.append(F.avg(temp).alias("temp"))
    return df.groupBy("topic").agg(*columns)


def source(spark, options: dict[str, str], agg: str, pruned: bool):
    reader = spark.read.format("tidemq").options(**options).option("topicFilter", "devices/+/telemetry")
    return (reader.schema(COLUMNS[agg]) if pruned else reader).load()


def tree_cpu() -> float:
    """CPU seconds used so far by this process and its descendants (Spark's JVM, its Python
    workers; the gateway is a thread here), from /proc (0 where there is none)."""
    stats = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = path.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (gone meanwhile)
        stats[int(path.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def measure(load, agg: str, records: int, runs: int) -> tuple[float, float, int]:
    """Best wall time of ``runs`` runs of the aggregation over ``load()`` (after one untimed
    warm-up), their mean CPU time (``tree_cpu``) and the scan's partitions."""
    partitions = load().rdd.getNumPartitions()
    rows = aggregate(load(), agg).collect()  # warm-up: Python workers, JIT
    assert len(rows) == min(DEVICES, records) and sum(r.n for r in rows) == records, "wrong aggregate"
    best = float("inf")
    cpu = tree_cpu()
    for _ in range(runs):
        started = time.perf_counter()
        rows = aggregate(load(), agg).collect()
        best = min(best, time.perf_counter() - started)
        assert sum(r.n for r in rows) == records
    return best, (tree_cpu() - cpu) / runs, partitions


def write_parquet(spark, options: dict[str, str], path: Path) -> None:
    """The same records, every native column, as Parquet (untimed): the twin of the source."""
    source(spark, options, "count", pruned=False).write.parquet(str(path))


class Alerts:
    """An MQTT subscriber of ``alerts/#`` that notes when each reading's alert arrives."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}  # reading number -> perf_counter at arrival
        self.duplicates = 0
        self.warm = threading.Event()
        self.lock = threading.Lock()

    def on_message(self, client, userdata, message) -> None:
        now = time.perf_counter()
        temp = json.loads(message.payload)["temp"]
        if temp < 100:  # a warm-up reading
            self.warm.set()
            return
        with self.lock:
            seq = int(temp) - 100
            if seq in self.arrived:
                self.duplicates += 1
            else:
                self.arrived[seq] = now


def mqtt_client(port: int, client_id: str, subscribe: str | None = None, on_message=None):
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    subscribed = threading.Event()
    client.on_subscribe = lambda *args: subscribed.set()
    if on_message is not None:
        client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.loop_start()
    if subscribe is not None:
        client.subscribe(subscribe, qos=1)
        assert subscribed.wait(10), f"no SUBACK for {subscribe}"
    return client


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def e2e(spark, tmp: Path, readings: int, rate: float, trigger: str, aggregates_trigger: str | None = None) -> str:
    """MQTT publish -> the telemetry_agg job -> alert received over MQTT, per reading."""
    from spark_sinks.jobs.telemetry_agg import JobConfig, start

    gw = GatewayThread(tmp / "e2e-data", mqtt_bind="127.0.0.1:0")
    clients = []
    queries = []
    try:
        port = gw.mqtt_port
        # the job reads devices/+/telemetry through its wildcard queue: hold the filter
        clients.append(mqtt_client(port, "bench-filter", "devices/+/telemetry"))
        alerts = Alerts()
        clients.append(mqtt_client(port, "bench-alerts", "alerts/#", alerts.on_message))
        pub = mqtt_client(port, "bench-devices")
        clients.append(pub)
        cfg = JobConfig(address="{}:{}".format(*gw.gateway.metrics_address), checkpoint=str(tmp / "e2e-ckpt"),
                        output=str(tmp / "e2e-out"), threshold=30.0, trigger=trigger,
                        aggregates_trigger=aggregates_trigger)
        t = time.perf_counter()
        queries = start(spark, cfg)
        deadline = time.monotonic() + 120
        while not alerts.warm.is_set():  # the first micro-batch starts the Python workers
            assert time.monotonic() < deadline and all(q.isActive for q in queries), "the job did not warm up"
            pub.publish("devices/warm/telemetry", json.dumps({"ts": time.time(), "temp": 50}), qos=1)
            alerts.warm.wait(0.5)
        time.sleep(2 * _seconds(trigger))  # two more triggers: the warm-up backlog drains
        print(f"# e2e job started and warm in {time.perf_counter() - t:.1f} s", flush=True)
        sent: dict[int, float] = {}
        begin = time.perf_counter()
        for seq in range(readings):
            wait = begin + seq / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            body = json.dumps({"ts": time.time(), "temp": 100 + seq}).encode()
            sent[seq] = time.perf_counter()
            pub.publish(f"devices/d{seq % 10}/telemetry", body, qos=1)
        deadline = time.monotonic() + 30
        while len(alerts.arrived) < readings and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)  # duplicates would come with the next trigger
        for q in queries:
            assert q.exception() is None, q.exception()
        latencies = [(alerts.arrived[seq] - sent[seq]) * 1000 for seq in sent if seq in alerts.arrived]
        lost = readings - len(latencies)
        return (f"spark_e2e readings={readings} p50_ms={percentile(latencies, 0.5):.0f} "
                f"p99_ms={percentile(latencies, 0.99):.0f} max_ms={max(latencies):.0f} "
                f"trigger_s={_seconds(trigger):g} rate_per_s={rate:g} lost={lost} duplicates={alerts.duplicates}"
                + (f" aggregates_trigger_s={_seconds(aggregates_trigger):g}" if aggregates_trigger else ""))
    finally:
        for q in queries:
            q.stop()
        for client in clients:
            client.disconnect()
            client.loop_stop()
        gw.stop()


def _seconds(trigger: str) -> float:
    number, _, unit = trigger.partition(" ")
    return float(number) * (60 if unit.startswith("minute") else 1)


def main() -> None:
    parser = runner.parser(__doc__, quick="one timed run per mode, 100 readings end to end (under 120 s)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, help="timed runs per mode (default 3, --quick 1)")
    parser.add_argument("--modes", default="dataDir,address")
    parser.add_argument("--aggs", default="groupcount,count,json", help="groupcount: groupBy(topic).count(); "
                        "count: count, payload bytes and last time per device; json: also the average temperature "
                        "parsed from the JSON payloads")
    parser.add_argument("--parts", default="source,parquet,e2e", help="source: read and aggregate stored messages; "
                        "parquet: the same queries over the same records written to Parquet (the baseline); "
                        "e2e: MQTT publish -> the telemetry_agg job -> alert over MQTT")
    parser.add_argument("--schema", default="pruned", choices=("pruned", "full"), help="pruned: the source reads "
                        "only the columns each query needs (its schema: COLUMNS); full: every column")
    parser.add_argument("--e2e-readings", type=int, help="readings timed end to end (default 600, --quick 100)")
    parser.add_argument("--e2e-rate", type=float, default=20.0, help="readings published per second")
    parser.add_argument("--trigger", default="1 second", help="the job's processing-time trigger")
    parser.add_argument("--aggregates-trigger", help="the aggregation's own trigger (default: --trigger)")
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    parts = args.parts.split(",")
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-bench-spark-"))
    out = runner.Lines(args.out)
    try:
        t = time.perf_counter()
        spark = start_spark(app="tidemq-bench")
        print(f"# spark session in {time.perf_counter() - t:.1f} s", flush=True)
        if "source" in parts or "parquet" in parts:
            gw = GatewayThread(tmp / "data")
            try:
                t = time.perf_counter()
                gw.call(fill(gw.gateway.store, args.records))
                gw.call(flush(gw.gateway.store))  # what a dataDir reader sees is what the index flushed
                print(f"# stored {args.records} messages in {time.perf_counter() - t:.1f} s", flush=True)
                modes = args.modes.split(",")
                connect = {mode: ({"dataDir": str(tmp / "data")} if mode == "dataDir" else
                                  {"address": "{}:{}".format(*gw.gateway.metrics_address)}) for mode in modes}
                parquet = tmp / "parquet"
                if "parquet" in parts:
                    t = time.perf_counter()
                    write_parquet(spark, connect[modes[0]], parquet)
                    print(f"# wrote them to Parquet in {time.perf_counter() - t:.1f} s (untimed)", flush=True)
                pruned = args.schema == "pruned"
                for agg in args.aggs.split(","):
                    baseline = None
                    if "parquet" in parts:
                        seconds, base_cpu, partitions = measure(lambda: spark.read.parquet(str(parquet)), agg,
                                                                args.records, runs)
                        baseline = args.records / seconds
                        line = (f"spark_parquet records={args.records} records_per_s={baseline:.0f} "
                                f"batch_s={seconds:.2f} cpu_s={base_cpu:.2f} agg={agg} runs={runs} "
                                f"partitions={partitions}")
                        out.emit(line)
                    for mode in modes if "source" in parts else ():
                        seconds, cpu, partitions = measure(lambda m=mode, a=agg: source(spark, connect[m], a, pruned),
                                                           agg, args.records, runs)
                        rate = args.records / seconds
                        schema = COLUMNS[agg].replace(" ", ":").replace(",:", ",") if pruned else "all"
                        line = (f"spark_source records={args.records} records_per_s={rate:.0f} "
                                f"batch_s={seconds:.2f} cpu_s={cpu:.2f} mode={mode} agg={agg} runs={runs} "
                                f"partitions={partitions} columns={schema}"
                                + (f" vs_parquet={rate / baseline:.2f} cpu_vs_parquet={base_cpu / cpu:.2f}"
                                   if baseline else ""))
                        out.emit(line)
            finally:
                gw.stop()
        if "e2e" in parts:
            readings = args.e2e_readings or (100 if args.quick else 600)
            out.emit(e2e(spark, tmp, readings, args.e2e_rate, args.trigger, args.aggregates_trigger))
        spark.stop()
    finally:
        out.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# {time.perf_counter() - started:.0f} s on {os.cpu_count()} cores", flush=True)


if __name__ == "__main__":
    main()
