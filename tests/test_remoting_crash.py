"""Crash safety of remoting sends through a real gateway process and RocketMQ's C++ client
(PyPI ``rocketmq``): a message answered SEND_OK in sync flush mode is in its topic after
``kill -9`` and a restart -- the kill at a random moment of a load from several producer
threads, or at the first SEND_OK on a topic created a moment before. Read back with the C++
pull consumer over every queue of the topic; duplicates counted (the client may retry a send)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from rocketmq import client as rmq
from rocketmq.exceptions import RocketMQException

from .crash_support import free_port, kill9, seeded_random, start_gateway, stop

pytestmark = [pytest.mark.usefixtures("rocketmq_home"), pytest.mark.slow]

LOAD = 2000  # messages per crash run
THREADS = 4  # producer threads (each send_sync waits for its SEND_OK)
SEND_TIMEOUT_MS = 2000  # a send to the killed gateway gives up within this
SEND_ATTEMPTS = 5  # a send that fails before the kill is sent again (it was not acknowledged)


class KillingProducer:
    """One C++ producer sending numbered messages from ``THREADS`` threads; the ``kill_at``-th
    SEND_OK kills the gateway from the thread that got it, before anything else is sent."""

    def __init__(self, addr: str, group: str, proc: subprocess.Popen, kill_at: int) -> None:
        self.producer = rmq.Producer(group, timeout=SEND_TIMEOUT_MS)
        self.producer.set_namesrv_addr(addr)
        self.producer.start()
        # librocketmq lets one thread open the broker connection and fails the sends of the
        # others meanwhile ("get timed_mutex timeout"): one send to another topic opens it first
        warm_up = rmq.Message("CrashWarmUp")
        warm_up.set_body("-")
        assert self.producer.send_sync(warm_up).status == rmq.SendStatus.OK
        self.proc = proc
        self.kill_at = kill_at
        self.acked: list[int] = []
        self.lock = threading.Lock()
        self.killed = threading.Event()
        self.killed_at = 0.0
        self.errors: list[Exception] = []  # sends that failed before the kill

    def _send(self, topic: str, numbers: range) -> None:
        for i in numbers:
            if self.killed.is_set():
                return
            message = rmq.Message(topic)
            message.set_body(str(i))
            message.set_keys(f"k{i}")
            result = None
            for attempt in range(SEND_ATTEMPTS):
                try:
                    result = self.producer.send_sync(message)
                    break
                except RocketMQException as exc:
                    if self.killed.is_set():  # (after the kill, sends fail: that is expected)
                        return
                    # librocketmq fails a send whose route lookup took too long on a loaded
                    # machine ("No route info of this topic"): not acknowledged, so sent again
                    if attempt == SEND_ATTEMPTS - 1:
                        self.errors.append(exc)
                        return
                    time.sleep(0.2)
            assert result is not None
            if result.status != rmq.SendStatus.OK:
                self.errors.append(AssertionError(f"send status {result.status}"))
                continue
            with self.lock:
                self.acked.append(i)
                if len(self.acked) == self.kill_at:
                    os.kill(self.proc.pid, signal.SIGKILL)
                    self.killed_at = time.monotonic()
                    self.killed.set()

    def run(self, topic: str, count: int) -> set[int]:
        """Send until the kill (or the end); the numbers answered SEND_OK."""
        threads = [threading.Thread(target=self._send, args=(topic, range(t, count, THREADS)))
                   for t in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        kill9(self.proc)  # (already dead, unless a send failed before the kill)
        self.producer.shutdown()
        return set(self.acked)


async def read_topic(addr: str, topic: str) -> Counter[int]:
    """Every message of ``topic``, from offset 0 of each of its queues, counted by number."""
    consumer = rmq.PullConsumer("CID-crash-check")
    consumer.set_namesrv_addr(addr)
    await asyncio.to_thread(consumer.start)
    try:
        bodies = await asyncio.to_thread(lambda: [int(m.body) for m in consumer.pull(topic)])
    finally:
        await asyncio.to_thread(consumer.shutdown)
    return Counter(bodies)


def check(name: str, acknowledged: set[int], counts: Counter[int]) -> None:
    missing = acknowledged - counts.keys()
    duplicates = sum(n - 1 for n in counts.values())
    print(f"{name}: acknowledged={len(acknowledged)} stored={len(counts)} duplicates={duplicates}")
    assert not missing, f"{name}: {len(missing)} messages answered SEND_OK lost, e.g. {sorted(missing)[:10]}"


async def crash_and_read(tmp_path: Path, topic: str, kill_at: int, count: int, group: str) -> tuple[set[int], Counter[int], float]:
    data_dir, port = tmp_path / "data", free_port()
    addr = f"127.0.0.1:{port}"
    proc = start_gateway(data_dir, remoting_port=port)
    try:
        started = time.monotonic()
        producer = await asyncio.to_thread(KillingProducer, addr, group, proc, kill_at)
        acknowledged = await asyncio.to_thread(producer.run, topic, count)
        assert not producer.errors, f"sends failed before the kill: {producer.errors[:3]}"
        assert producer.killed.is_set(), "the gateway was not killed"
    finally:
        kill9(proc)
    proc = start_gateway(data_dir, remoting_port=port)
    try:
        return acknowledged, await read_topic(addr, topic), producer.killed_at - started
    finally:
        stop(proc)


async def test_kill_9_at_a_random_moment_under_load(tmp_path: Path) -> None:
    rng = seeded_random("remoting random kill")
    acknowledged, stored, _ = await crash_and_read(tmp_path, "CrashLoad", rng.randrange(1, LOAD), LOAD, "PID-crash-load")
    check("random kill", acknowledged, stored)


async def test_kill_9_at_the_first_send_ok_on_a_new_topic(tmp_path: Path) -> None:
    rng = seeded_random("remoting first-ack kill")
    topic = f"CrashFresh{rng.randrange(1 << 30)}"
    acknowledged, stored, after = await crash_and_read(tmp_path, topic, 1, 200, "PID-crash-fresh")
    print(f"killed {after:.3f} s after the producer started on the new topic")
    check("first SEND_OK", acknowledged, stored)
