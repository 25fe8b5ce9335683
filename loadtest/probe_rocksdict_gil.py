"""Does rocksdict release the GIL in ``Rdict.write`` and ``WriteBatch.put``? One printed line per case.

    python -m loadtest.probe_rocksdict_gil

The main thread counts pure-Python loop iterations for 2 s while a second thread does one
thing in a loop: sleep (the reference, 100 %), hash 1 MiB with sha256 (releases the GIL:
near 100 % on a free core), a pure-Python loop (holds it: ~50 %), ``Rdict.write`` of prebuilt
batches of 50,000 entries at random queues, or ``WriteBatch.put`` of them. Only an operation
that releases the GIL can move the index write off the event loop's thread into another one;
rerun this when rocksdict is upgraded. Needs a free core to mean anything (look at the load).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
import tempfile
import threading
import time

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

SECONDS = 2.0
ENTRIES = 50_000
KEY = struct.Struct(">cIQ")  # the consume-queue entry key, store/index/consumequeue.py
VALUE = struct.Struct(">QIqq").pack(1, 2, 3, 4)


def batches(count: int) -> list[WriteBatch]:
    rng = random.Random(1)
    out = []
    for i in range(count):
        batch = WriteBatch(raw_mode=True)
        for _ in range(ENTRIES):
            batch.put(KEY.pack(b"q", rng.randrange(1_000_000), i), VALUE)
        out.append(batch)
    return out


def main_loop_rate(work) -> tuple[int, int]:
    """(main-thread loop iterations in SECONDS, calls the worker completed)"""
    stop = threading.Event()
    calls = 0

    def worker() -> None:
        nonlocal calls
        while not stop.is_set() and work():
            calls += 1

    thread = threading.Thread(target=worker)
    thread.start()
    threading.Timer(SECONDS, stop.set).start()
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n += 1
    thread.join()
    return n, calls


def main() -> None:
    path = tempfile.mkdtemp(prefix="tidemq-gil-")
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(8 << 20)  # as the index (store/rocks.py)
    db = Rdict(path, opts)
    wo = WriteOptions()
    wo.disable_wal = True
    db.set_write_options(wo)
    big = os.urandom(1 << 20)
    keys = [KEY.pack(b"q", random.randrange(1_000_000), i) for i in range(ENTRIES)]

    def put_all() -> bool:
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.put(key, VALUE)
        return True

    def pyloop() -> bool:
        total = 0
        for i in range(100_000):
            total ^= i
        return True

    prebuilt = iter(batches(80))  # built before the clock starts

    def write_next() -> bool:
        batch = next(prebuilt, None)
        if batch is None:
            return False
        db.write(batch)
        return True

    try:
        idle, _ = main_loop_rate(lambda: time.sleep(0.01) or True)
        for name, work in (
            ("sha256", lambda: bool(hashlib.sha256(big).digest())),
            ("python_loop", pyloop),
            ("rdict_write", write_next),
            ("writebatch_put", put_all),
        ):
            n, calls = main_loop_rate(work)
            print(f"gil_probe worker={name} main_loop_pct={n * 100 // idle} worker_calls={calls}", flush=True)
    finally:
        db.close()
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
