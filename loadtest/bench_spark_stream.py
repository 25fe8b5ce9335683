"""Spark streaming benchmark: the telemetry job (``spark_telemetry.py``) over the ``tidemq``
source and the same job over Spark's file stream source (the same readings as JSON files), in
one Spark session.

    python -m loadtest.bench_spark_stream [--quick] [--mode local|cluster] [--readings N] [--per-trigger N]
                                          [--sources tidemq,file[,file_text]] [--rounds N] [--min-partitions N]
                                          [--no-warm-up] [--profile] [--timeline] [--python plain|launcher] [--out FILE]

A gateway (a thread here, metrics listener on a free port) gets ``--readings`` readings
(200,000) straight into its store, 1,000 devices on 10 sites; the same readings are written as
JSON-lines files of 10,000 readings. Each query averages the temperature per site per 1-minute
window under a 1-minute watermark into a memory sink (append), reading at most
``--per-trigger`` (50,000) readings a micro-batch: ``maxOffsetsPerTrigger`` for tidemq
(``address`` mode, the gateway's data API), ``maxFilesPerTrigger`` for the files (``file``:
Spark's JSON reader; ``file_text``: the lines parsed with ``from_json`` as the tidemq job parses
its values, the same work after the read). ``--mode cluster`` runs ``local-cluster[2,1,1024]`` (executors in JVMs of their own);
``--python launcher`` has Spark start its Python processes with ``tidemq-spark-python``
(``spark_sinks/python.py``: pyspark imported with its bytecode, not compiled from Spark's
archive in each process) instead of this interpreter. One line a source::

    spark_stream source=tidemq mode=local round=1 python=plain rows_per_s=... first_batch_s=... batches=4 overall_rows_per_s=...
        cpu_s=... latest_offset_ms=... planning_ms=... get_batch_ms=... add_batch_ms=... commit_ms=...

Each round (``--rounds``, 2) runs a fresh query per source over the same readings, in turn.
The first round's queries are the first of their kind in the JVM: each pays what its path does
once (the Python workers' start for tidemq; the JIT compiling code it is the first to run; the
watermark filter's code, generated once per watermark value, so for whichever source reaches a
value first). A later round's queries find all that done, as a long-running query's micro-batches
do after its first few: its ``rows_per_s`` is the steady rate to compare, the first round's
``first_batch_s`` the first batch a user's new query waits for.

``rows_per_s``: readings over the wall time of the micro-batches after the first (steady);
``cpu_s``: CPU seconds of the whole query, start to last reading, of this process (the
gateway's thread for tidemq) and every process it started (Spark's JVM, the Python workers):
on a machine shared with other work, the figure that other work disturbs least; a
``spark_stream_cpu`` line after each splits a steady micro-batch's CPU seconds by process:
Spark's JVMs (``jvm_jit``: the part of it their JIT compilers took), this process
(``gateway``: the data API's reads), the Python workers, the stream's planning runner on the
driver;
``first_batch_s``: the first micro-batch's wall time (Python workers start there; a
``spark_stream_first`` line splits it: the parts Spark's progress reports and when each Python
process it needed started, seconds after the query's start); the ``_ms``
fields: the mean per micro-batch of the parts Spark's progress reports (``latestOffset``,
``queryPlanning``, ``getBatch``, ``addBatch`` -- the read, the Python worker, the Arrow transfer
and the aggregation -- and the WAL and commit writes), steady batches only. A fresh query per
source, after a warm-up query over Spark's ``rate`` source (the same parsing and aggregation,
three micro-batches; ``--no-warm-up``: none) so that neither compared query pays the JVM's
start-up (class loading, code generation, JIT: a share of the first batch, whichever source
runs first); the tidemq query runs first (its Python workers' start is its own cost, as a
user's first query pays it). ``--profile`` adds a line splitting a batch read's time: the data API's reads
alone (``read_s``) and the same ranges read through Spark (``spark_read_s``). ``--timeline`` has
Spark write its event log and adds, at the end, a ``spark_stream_timeline`` line per micro-batch's
job: its stages' wall times and their tasks' run and CPU times (``loadtest/spark_timeline.py``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from loadtest import runner
from loadtest import spark_timeline
from loadtest.bench_spark import GatewayThread
from loadtest.spark_telemetry import (
    BASE_TS,
    READING_SCHEMA,
    fill_store,
    parsed,
    site_averages,
    spark_python,
    start_spark,
    tidemq_readings,
    write_files,
)

SITES, DEVICES = 10, 1000
PER_FILE = 10_000
MASTERS = {"local": "local[2]", "cluster": "local-cluster[2,1,1024]"}
# How often the query's progress is looked at: each look copies every recent progress report
# out of the JVM as JSON, CPU taken from the job on a small machine (the figures come from the
# reports' own durations, not from when the loop notices the end)
POLL_S = 0.5
PARTS = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


def file_readings(spark, folder: Path, per_trigger: int):
    from pyspark.sql import functions as F

    return (spark.readStream.schema(READING_SCHEMA).option("maxFilesPerTrigger", max(1, per_trigger // PER_FILE))
            .json(str(folder)).withColumn("event_time", F.col("ts").cast("timestamp")))


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds used so far by this process (``gateway``: its thread serves the reads) and
    all it started, by kind: Spark's JVMs, the stream's planning runner, the other Python
    workers. A process's ended children count for it (it has waited for them)."""
    import psutil

    kinds: dict[str, float] = {}
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t, command = proc.cpu_times(), " ".join(proc.cmdline())
        except psutil.Error:  # (ended meanwhile: its parent's children_ times hold it)
            continue
        kind = ("gateway" if proc.pid == me.pid else "jvm" if "java" in command else
                "stream_runner" if "python_streaming_source_runner" in command else
                "python_workers" if "python" in command else "other")
        kinds[kind] = kinds.get(kind, 0.0) + t.user + t.system + t.children_user + t.children_system
        if kind == "jvm":
            kinds["jvm_jit"] = kinds.get("jvm_jit", 0.0) + jit_cpu_s(proc.pid)
    return kinds


def jit_cpu_s(pid: int) -> float:
    """CPU seconds of a JVM's JIT compiler threads (``C1``/``C2 CompilerThread``, Linux's
    /proc): code the JVM is still compiling, a share of ``jvm`` that a longer run no longer pays."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if "CompilerThre" not in (task / "comm").read_text():
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that ended)
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def file_lines(spark, folder: Path, per_trigger: int):
    """The same files read as lines of text and parsed with ``from_json``, as the tidemq job
    parses its values: the file source without its own JSON reader (``source=file_text``)."""
    from pyspark.sql import functions as F

    lines = spark.readStream.option("maxFilesPerTrigger", max(1, per_trigger // PER_FILE)).text(str(folder))
    return (lines.select(F.from_json("value", READING_SCHEMA).alias("r")).select("r.*")
            .withColumn("event_time", F.col("ts").cast("timestamp")))


def rate_readings(spark, per_trigger: int):
    """Readings made up by Spark's built-in ``rate`` source (``per_trigger`` a second), as JSON
    parsed like the others': the warm-up query's input, read by neither source compared."""
    from pyspark.sql import functions as F

    body = F.to_json(F.struct((F.concat(F.lit("s"), F.col("value") % SITES)).alias("site"),
                              (F.concat(F.lit("d"), F.col("value") % DEVICES)).alias("device"),
                              (F.lit(BASE_TS) + F.col("value") / 100).alias("ts"),
                              (F.lit(18.0) + F.col("value") * 7 % 100 / 10).alias("temp")))
    rows = (spark.readStream.format("rate").option("rowsPerSecond", per_trigger).load()
            .select(F.from_json(body, READING_SCHEMA).alias("r")).select("r.*"))
    return rows.withColumn("event_time", F.col("ts").cast("timestamp"))


def warm_up(spark, per_trigger: int) -> None:
    """The job over the ``rate`` source for a few micro-batches: the JVM's share of the job
    (JSON parsing, the windowed aggregation, its state, the memory sink) is loaded, compiled
    and JIT-warmed before the compared queries, so the first of them is not charged for it."""
    run(spark, "warm_up", rate_readings(spark, per_trigger), 3 * per_trigger, 120)


def cpu_line(source: str, mode: str, round_: int, progress: list[dict], steady: dict[str, float]) -> str:
    """CPU seconds a steady micro-batch took, in all and by kind of process (``cpu_by_kind``)."""
    n = max(1, len(progress) - 1)
    kinds = " ".join(f"{k}={steady.get(k, 0.0) / n:.2f}"
                     for k in ("jvm", "jvm_jit", "gateway", "python_workers", "stream_runner"))
    total = sum(v for k, v in steady.items() if k != "jvm_jit")  # (jvm_jit is a part of jvm)
    return f"spark_stream_cpu source={source} mode={mode} round={round_} per_batch_s={total / n:.2f} {kinds}"


def started_since(since: float) -> list[tuple[float, str]]:
    """The Python processes this process started (directly or not) since ``since`` (epoch
    seconds): (seconds after ``since``, kind), in order: when a query's first micro-batch had
    each of Spark's Python workers started."""
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            created, command = proc.create_time(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if created >= since and "python" in command and "java" not in command:
            kind = ("stream_runner" if "python_streaming_source_runner" in command else
                    "daemon" if "pyspark.daemon" in command else "worker")
            out.append((created - since, kind))
    return sorted(out)


def first_line(source: str, mode: str, round_: int, progress: list[dict], spawned: list[tuple[float, str]],
               python: str = "plain") -> str:
    """Where a query's first micro-batch went: the parts Spark's progress reports, and when the
    Python processes it needed started (seconds after the query's start)."""
    parts = " ".join(f"{snake(k)}_ms={progress[0]['durationMs'].get(k, 0)}" for k in PARTS)
    started = ",".join(f"{kind}+{at:.2f}" for at, kind in spawned) or "none"
    return (f"spark_stream_first source={source} mode={mode} round={round_} python={python} "
            f"first_batch_s={progress[0]['durationMs']['triggerExecution'] / 1000:.2f} {parts} python_started={started}")


def run(spark, name: str, readings_df, total: int,
        timeout_s: float) -> tuple[list[dict], float, dict[str, float], list[tuple[float, str]]]:
    """Run the job to the end of ``total`` readings: the progress of its micro-batches with
    rows, the CPU seconds it took in all (``cpu_by_kind``, ``jvm_jit`` counted once, in ``jvm``)
    and, by kind, those of the
    micro-batches after the first (from when the first is seen to have ended), and the Python
    processes started for its first micro-batch (``started_since``)."""
    before = cpu_by_kind()
    since = time.time()
    query = (site_averages(readings_df).writeStream.format("memory").queryName(name).outputMode("append")
             .start())
    deadline = time.monotonic() + timeout_s
    try:
        while not (query.lastProgress or {}).get("numInputRows"):  # (one report: cheap to look at often)
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"{name}: no micro-batch"
            time.sleep(0.02)
        after_first = cpu_by_kind()
        spawned = started_since(since)
        while True:
            progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
            if sum(p["numInputRows"] for p in progress) >= total:
                end = cpu_by_kind()
                steady = {k: v - after_first.get(k, 0.0) for k, v in end.items()}
                used = sum(v for k, v in end.items() if k != "jvm_jit") - sum(v for k, v in before.items() if k != "jvm_jit")
                return progress, used, steady, spawned
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"{name}: {sum(p['numInputRows'] for p in progress)} of {total}"
            time.sleep(POLL_S)
    finally:
        query.stop()


def line(source: str, mode: str, round_: int, progress: list[dict], total: int, cpu_s: float,
         python: str = "plain") -> str:
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    steady, rows = progress[1:], sum(p["numInputRows"] for p in progress[1:])
    steady_s = sum(durations[1:])
    parts = " ".join(f"{snake(k)}_ms={sum(p['durationMs'].get(k, 0) for p in steady) / max(1, len(steady)):.0f}"
                     for k in PARTS)
    return (f"spark_stream source={source} mode={mode} round={round_} python={python} "
            f"rows_per_s={rows / steady_s if steady_s else 0:.0f} "
            f"first_batch_s={durations[0]:.2f} batches={len(progress)} "
            f"overall_rows_per_s={total / sum(durations):.0f} cpu_s={cpu_s:.1f} "
            f"batch_s={','.join(f'{d:.2f}' for d in durations)} {parts}")


def snake(name: str) -> str:
    return {"latestOffset": "latest_offset", "queryPlanning": "planning", "getBatch": "get_batch",
            "addBatch": "add_batch", "walCommit": "wal_commit", "commitOffsets": "commit"}[name]


def profile(spark, address: str, total: int, per_trigger: int) -> str:
    """A batch read of ``per_trigger`` readings: the data API alone (this process, one client)
    and through Spark (count of the Kafka-shaped rows), both warm."""
    from bridge.data_client import HttpClient

    client = HttpClient(f"http://{address}")
    queues = client.topic_queues(["sensors/+/+/temp"])
    share = per_trigger / total
    ranges = {q: (low, low + max(1, int((high - low) * share))) for q, (low, high) in queues.items()}
    started = time.perf_counter()
    rows = 0
    for queue, (start, end) in ranges.items():
        fetch = client.read(queue, start, end, 100_000, ("topic", "payload", "timestamp", "offset"))
        rows += sum(b.num_rows for b in fetch.batches)
    read_s = time.perf_counter() - started
    starting = "{%s}" % ",".join(f'"{q}":{s}' for q, (s, _) in ranges.items())
    ending = "{%s}" % ",".join(f'"{q}":{e}' for q, (_, e) in ranges.items())
    df = (spark.read.format("tidemq").option("address", address).option("topicFilter", "sensors/+/+/temp")
          .option("schema", "kafka").option("startingOffsets", starting).option("endingOffsets", ending).load())
    df.count()  # warm
    started = time.perf_counter()
    spark_rows = df.select("value").count()
    spark_s = time.perf_counter() - started
    return (f"spark_stream_profile rows={rows} spark_rows={spark_rows} queues={len(ranges)} read_s={read_s:.2f} "
            f"spark_read_s={spark_s:.2f}")


def main() -> None:
    parser = runner.parser(__doc__, quick="50,000 readings")
    parser.add_argument("--mode", choices=sorted(MASTERS), default="local")
    parser.add_argument("--readings", type=int, default=200_000)
    parser.add_argument("--per-trigger", type=int, default=50_000)
    parser.add_argument("--sources", default="tidemq,file")
    parser.add_argument("--rounds", type=int, default=2, help="queries per source, in turn (the module says why)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--python", choices=("plain", "launcher"), default="plain",
                        help="Spark's Python processes: this interpreter, or tidemq-spark-python (pyspark's bytecode)")
    parser.add_argument("--min-partitions", type=int, help="the tidemq source's minPartitions")
    parser.add_argument("--timeline", action="store_true",
                        help="Spark's event log: each micro-batch's stages and tasks, timed (at the end)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="no warm-up query: the first source's query pays the JVM's warm-up")
    args = parser.parse_args()
    total = 50_000 if args.quick else args.readings
    out = runner.Lines(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-stream-bench-"))
    gateway = GatewayThread(tmp / "data")
    try:
        address = "{}:{}".format(*gateway.gateway.metrics_address)
        gateway.call(fill_store(gateway.gateway.store, 0, total, SITES, DEVICES))
        write_files(tmp / "files", 0, total, SITES, DEVICES, PER_FILE)
        events = tmp / "events"
        spark = start_spark(MASTERS[args.mode], python=spark_python(args.python),
                            conf=spark_timeline.conf(events) if args.timeline else None)
        if not args.no_warm_up:
            warm_up(spark, args.per_trigger)
        for round_ in range(1, args.rounds + 1):
            for source in args.sources.split(","):
                if source == "tidemq":
                    extra = {"minPartitions": str(args.min_partitions)} if args.min_partitions else {}
                    df = parsed(tidemq_readings(spark, address, args.per_trigger, **extra))
                elif source == "file_text":
                    df = file_lines(spark, tmp / "files", args.per_trigger)
                else:
                    df = file_readings(spark, tmp / "files", args.per_trigger)
                progress, cpu_s, steady, spawned = run(spark, f"{source}_averages_{round_}", df, total, 600)
                out.emit(line(source, args.mode, round_, progress, total, cpu_s, args.python))
                out.emit(cpu_line(source, args.mode, round_, progress, steady))
                out.emit(first_line(source, args.mode, round_, progress, spawned, args.python))
        if args.profile:
            out.emit(profile(spark, address, total, args.per_trigger))
        spark.stop()  # (the event log is whole once the session stops)
        if args.timeline:
            for timed in spark_timeline.lines(events):
                out.emit(timed)
    finally:
        gateway.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        out.close()


if __name__ == "__main__":
    main()
