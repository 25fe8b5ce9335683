"""Restart loop of a two-query Spark job over the ``tidemq`` source: how many restarts fail, and
whether the outputs stay exact.

    python -m loadtest.spark_restarts [--restarts N] [--budget-s S] [--fresh-jvm] [--readings N] [--out FILE]

The job (``spark_telemetry.py``'s telemetry readings, ``sensors/+/+/temp``, ``schema=kafka``)
has two streaming queries over the source, each with its own checkpoint: the per-site 1-minute
averages (watermark, append) and the raw readings, both to Parquet. Each restart starts both
queries from their checkpoints, lets them run a random 1-4 s while more readings arrive, and
ends them: a ``kill -9`` of the driver with ``--fresh-jvm`` (a new driver JVM each time, as the
issue's job), else a stop in this one session after registering the source afresh (as a new
driver does). A query that dies counts as a failed restart, with its error's first line.
At the end both queries drain what is stored (``availableNow``) and the outputs are checked:
every reading once in the raw output, every closed window's count and average as computed here::

    spark_restarts restarts=50 failed=0 mode=session readings=... raw_exact=yes windows_exact=yes
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest import runner
from loadtest.bench_spark import GatewayThread
from loadtest.spark_telemetry import (
    expected_averages,
    fill_store,
    parsed,
    site_averages,
    start_spark,
    tidemq_readings,
)

SITES, DEVICES = 4, 40
PER_TRIGGER = 5_000


def start_queries(spark, address: str, work: Path, available_now: bool = False) -> list:
    """The job's two queries, from their checkpoints under ``work``."""
    readings = parsed(tidemq_readings(spark, address, PER_TRIGGER))
    queries = []
    for name, df in (("aggregates", site_averages(readings)),
                     ("raw", readings.select("site", "device", "ts", "temp", "partition", "offset"))):
        writer = (df.writeStream.format("parquet").outputMode("append").queryName(name)
                  .option("checkpointLocation", str(work / "ckpt" / name)).option("path", str(work / "out" / name)))
        writer = writer.trigger(availableNow=True) if available_now else writer
        queries.append(writer.start())
    return queries


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = next((line for line in text if "Exception" in line and "Caused by" in line), None)
    return (detail or (text[0] if text else type(exc).__name__))[:300]


def run_for(queries: list, seconds: float) -> str | None:
    """Let ``queries`` run ``seconds``; the first error of one that died, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for q in queries:
            if not q.isActive and q.exception() is not None:
                return first_line(q.exception())
        time.sleep(0.1)
    return None


def started(queries: list, timeout_s: float) -> str | None:
    """Wait until each query has run a micro-batch in this run; the error of one that died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        error = run_for(queries, 0.2)
        if error or all(q.recentProgress for q in queries):
            return error
    return f"no micro-batch within {timeout_s:g} s"


def child(address: str, work: Path) -> None:
    """A driver of its own (``--fresh-jvm``): say when both queries ran (or one died), then run
    until killed."""
    spark = start_spark(app="tidemq-restarts")
    queries = start_queries(spark, address, work)
    error = started(queries, 120)
    print(f"FAILED {error}" if error else "STARTED", flush=True)
    if error:
        sys.exit(1)
    while True:
        error = run_for(queries, 60)
        if error:
            sys.exit(1)


def check(spark, work: Path, readings: int) -> tuple[bool, bool, str]:
    """(every reading once in raw, every window exact, detail) after the final drain."""
    from pyspark.sql import functions as F

    raw = spark.read.parquet(str(work / "out" / "raw"))
    total, distinct = raw.count(), raw.select("partition", "offset").distinct().count()
    agg = spark.read.parquet(str(work / "out" / "aggregates")).collect()
    got = {(r.site, r.window_start.timestamp()): (r.n, r.avg_temp) for r in agg}
    last_ts = raw.agg(F.max("ts")).first()[0]
    want = expected_averages(readings, SITES, DEVICES, last_ts - 60)
    wrong = [k for k, v in got.items() if k not in want or v[0] != want[k][0] or abs(v[1] - want[k][1]) > 1e-9]
    missing = [k for k in want if k not in got]
    raw_ok = total == distinct == readings
    windows_ok = not wrong and not missing and len(agg) == len(got)
    return raw_ok, windows_ok, (f"raw_rows={total} raw_distinct={distinct} windows={len(got)} "
                                f"windows_expected={len(want)} wrong={len(wrong)} missing={len(missing)}")


def main() -> None:
    parser = runner.parser(__doc__)
    parser.add_argument("--restarts", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=480, help="no restart begins after this many seconds "
                        "(the drain and the checks follow)")
    parser.add_argument("--readings", type=int, default=60_000, help="stored before the first start")
    parser.add_argument("--more", type=int, default=4_000, help="readings stored at each restart")
    parser.add_argument("--fresh-jvm", action="store_true", help="a new driver per restart, killed with -9")
    parser.add_argument("--child", help=argparse_hidden())
    parser.add_argument("--address", help=argparse_hidden())
    args = parser.parse_args()
    if args.child:
        child(args.address, Path(args.child))
        return
    out = runner.Lines(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="tidemq-restarts-"))
    gateway = GatewayThread(tmp / "data")
    try:
        address = "{}:{}".format(*gateway.gateway.metrics_address)
        store = gateway.gateway.store
        gateway.call(fill_store(store, 0, args.readings, SITES, DEVICES))
        stored = args.readings
        spark = start_spark(app="tidemq-restarts")
        from spark_sinks import register

        failed: list[str] = []
        rng = random.Random(36)
        began = time.monotonic()
        restarts = 0
        for i in range(args.restarts):
            if time.monotonic() - began > args.budget_s:
                break
            restarts += 1
            seconds = rng.uniform(1, 4)
            if args.fresh_jvm:
                proc = subprocess.Popen([sys.executable, "-m", "loadtest.spark_restarts", "--child", str(tmp),
                                         "--address", address], stdout=subprocess.PIPE, text=True)
                error = wait_child(proc, seconds)
            else:
                register(spark)  # a fresh registration, as a new driver's
                queries = start_queries(spark, address, tmp)
                error = started(queries, 120) or run_for(queries, seconds)
                for q in queries:
                    q.stop()
            if error:
                failed.append(error)
                print(f"restart {i}: FAILED {error}", flush=True)
            else:
                print(f"restart {i}: ok ({seconds:.1f} s)", flush=True)
            gateway.call(fill_store(store, stored, args.more, SITES, DEVICES))
            stored += args.more
        register(spark)
        for q in start_queries(spark, address, tmp, available_now=True):
            q.awaitTermination()
        raw_ok, windows_ok, detail = check(spark, tmp, stored)
        out.emit(f"spark_restarts restarts={restarts} failed={len(failed)} "
                 f"mode={'fresh-jvm' if args.fresh_jvm else 'session'} readings={stored} "
                 f"raw_exact={'yes' if raw_ok else 'no'} windows_exact={'yes' if windows_ok else 'no'} {detail}")
        for error in sorted(set(failed)):
            out.emit(f"spark_restarts error count={failed.count(error)} {error}")
        spark.stop()
    finally:
        gateway.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        out.close()


def wait_child(proc: subprocess.Popen, seconds: float) -> str | None:
    """Let a ``--fresh-jvm`` driver start both queries and run a micro-batch of each, then
    ``seconds`` more, then kill it with -9; the error of a query that died."""
    assert proc.stdout is not None
    said = proc.stdout.readline().strip()  # (the child says within its 120 s)
    if said != "STARTED":
        proc.wait()
        return said.removeprefix("FAILED ") or f"the driver exited with {proc.returncode}"
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        time.sleep(0.1)
    if proc.poll() is not None:
        return f"the driver exited with {proc.returncode} while running"
    proc.kill()
    proc.wait()
    return None


def argparse_hidden() -> str:
    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
