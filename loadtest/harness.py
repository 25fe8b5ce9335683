"""The benchmarks' shared harness: forked worker processes and what they share with the
coordinator (``Workers`` and the slots of its shared array), CPU accounting of generator and
broker processes (``CpuSampler``), when receiving workers stop (``drain_stop``), and small
helpers. Used by bench_mqtt, bench_amqp, bench_cluster and bench_remoting."""

from __future__ import annotations

import multiprocessing as mp
import queue
import selectors
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from loadtest.brokers import BrokerUnavailable, ScenarioError

SLACK_S = 30.0  # on top of a phase's own bound before the coordinator gives up on a worker
WORKER_WAIT_S = 600.0  # the longest a worker waits for a signal from the coordinator

# Slots of the shared array the coordinator and the workers talk through.
EXPECTED, DRAIN_DEADLINE, PUBLISHERS_DONE, DELIVERED = 0, 1, 2, 3


# -- CPU accounting --------------------------------------------------------------------------------
MACHINE = -1  # the key of the whole machine's busy CPU seconds among the sampled pids


class CpuSampler:
    """Samples the CPU seconds of some processes every 0.1 s, so that the share of any interval
    (first send to last receive, known only afterwards) can be read back."""

    def __init__(self, pids: list[int]) -> None:
        self.procs = {pid: psutil.Process(pid) for pid in pids}
        self.last: dict[int, float] = dict.fromkeys([MACHINE, *pids], 0.0)
        self.samples: list[tuple[int, dict[int, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(5)
            self._sample()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def _sample(self) -> None:
        machine = psutil.cpu_times()
        self.last[MACHINE] = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        for pid, proc in self.procs.items():
            try:
                times = proc.cpu_times()
                self.last[pid] = times.user + times.system
            except psutil.Error:
                pass  # gone: keep its last figure
        self.samples.append((time.monotonic_ns(), dict(self.last)))

    def _window(self, start_ns: int, end_ns: int) -> tuple[tuple[int, dict[int, float]], tuple[int, dict[int, float]]]:
        """The samples just before ``start_ns`` and just after ``end_ns``: the measured window,
        widened to the 0.1 s sampling."""
        before = max((s for s in self.samples if s[0] <= start_ns), default=self.samples[0], key=lambda s: s[0])
        after = min((s for s in self.samples if s[0] >= end_ns), default=self.samples[-1], key=lambda s: s[0])
        return before, after

    def percent(self, pids: list[int], start_ns: int, end_ns: int) -> float:
        if len(self.samples) < 2:
            return 0.0
        before, after = self._window(start_ns, end_ns)
        elapsed = (after[0] - before[0]) / 1e9
        if elapsed <= 0:
            return 0.0
        return 100.0 * sum(after[1][p] - before[1][p] for p in pids) / elapsed

    def split(self, generator: list[int], broker: int, start_ns: int, end_ns: int) -> tuple[float, float, float]:
        """The CPU % (100 = one core) of the generator, the broker and the rest of the machine."""
        gen = self.percent(generator, start_ns, end_ns)
        own = self.percent([broker], start_ns, end_ns)
        other = max(0.0, self.percent([MACHINE], start_ns, end_ns) - gen - own)
        return gen, own, other

    def shares(self, generator: list[int], broker: int, start_ns: int, end_ns: int) -> str:
        gen, own, other = self.split(generator, broker, start_ns, end_ns)
        return f"gen_cpu_pct={gen:.0f} broker_cpu_pct={own:.0f} other_cpu_pct={other:.0f}"

    def us_per_msg(self, pids: list[int], start_ns: int, end_ns: int, messages: int) -> float:
        """CPU microseconds of ``pids`` per message: their CPU seconds over the window (widened
        to the sampling, where they are idle: the work of a message is all inside it) divided by
        the ``messages`` handled in it; 0 when none were."""
        if len(self.samples) < 2 or messages <= 0:
            return 0.0
        before, after = self._window(start_ns, end_ns)
        return 1e6 * sum(after[1][p] - before[1][p] for p in pids) / messages


@dataclass(slots=True)
class Timed:
    """What ``run_timed`` measured: messages handled between the first worker's start and the
    last one's end, the CPU shares of that window and the broker's CPU per message."""

    count: int
    seconds: float
    cpu: str
    us_per_msg: float


def run_timed(jobs: list[tuple[Callable[..., None], tuple]], broker_pid: int, timeout_s: float) -> Timed:
    """Forks a process per (target, args) of ``jobs``, called with ``(*args, go, results)``: each
    connects, waits for ``go``, works and puts (count, start, end) on ``results``."""
    ctx = mp.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    procs = []
    for target, args in jobs:
        proc = ctx.Process(target=target, args=(*args, go, results), daemon=True)
        proc.start()
        procs.append(proc)
    time.sleep(0.3)  # connected
    sampler = CpuSampler([p.pid for p in procs] + [broker_pid])
    sampler.start()
    go.set()
    outcomes = [results.get(timeout=timeout_s) for _ in procs]
    sampler.stop()
    for proc in procs:
        proc.join(10)
    count = sum(o[0] for o in outcomes)
    start, end = min(o[1] for o in outcomes), max(o[2] for o in outcomes)
    start_ns, end_ns = int(start * 1e9), int(end * 1e9)
    return Timed(count, end - start, sampler.shares([p.pid for p in procs], broker_pid, start_ns, end_ns),
                 sampler.us_per_msg([broker_pid], start_ns, end_ns, count))


# -- worker processes ------------------------------------------------------------------------------
class Workers:
    """The load generator's processes (forked) and what they share with the coordinator."""

    def __init__(self, subscriber_procs: int = 0) -> None:
        self.ctx = mp.get_context("fork")
        self.results: Any = self.ctx.Queue()
        self.go = self.ctx.Event()
        self.release = self.ctx.Event()
        self.shared: Any = self.ctx.Array("q", DELIVERED + max(1, subscriber_procs), lock=False)
        self.shared[DRAIN_DEADLINE] = 2**62
        self.procs: list[Any] = []
        self._stash: list[tuple[str, str, int, Any]] = []

    def start(self, target: Any, *args: Any) -> None:
        proc = self.ctx.Process(target=target, args=(self, len(self.procs), *args), daemon=True)
        proc.start()
        self.procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def report(self, kind: str, role: str, index: int, payload: Any = None) -> None:
        self.results.put((kind, role, index, payload))

    def collect(self, role: str, count: int, kind: str, timeout_s: float) -> list[Any]:
        """The next ``count`` messages of ``kind`` from ``role``; an error from any worker ends the scenario."""
        deadline = time.monotonic() + timeout_s
        got: list[Any] = []
        while len(got) < count:
            for item in list(self._stash):
                if item[0] == kind and item[1] == role:
                    self._stash.remove(item)
                    got.append(item[3])
            if len(got) >= count:
                break
            try:
                item = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise ScenarioError(f"{count - len(got)} {role} worker(s) sent no {kind} within {timeout_s:g} s") from None
            if item[0] == "refused":
                raise BrokerUnavailable(str(item[3]))
            if item[0] == "error":
                raise ScenarioError(str(item[3]))
            self._stash.append(item)
        return got

    def publishers_done(self, expected: int, drain_s: float) -> None:
        """Tell the receiving workers how many messages to expect and how long they may drain."""
        self.shared[EXPECTED] = expected
        self.shared[DRAIN_DEADLINE] = time.monotonic_ns() + int(drain_s * 1e9)
        self.shared[PUBLISHERS_DONE] = 1

    def close(self) -> None:
        self.release.set()
        self.go.set()  # a worker still waiting to start finds the release set and leaves
        for proc in self.procs:
            proc.join(10)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self.results.close()
        self.results.cancel_join_thread()


def drain_stop(shared: Any, now: int, last_data: int, idle_ns: int, hard_stop: int,
               complete: Any) -> str | None:
    """Whether a receiving worker stops now, and why: "complete" (``complete(expected)``: all
    arrived), "idle" (nothing for ``idle_ns`` once the publishers are done) or "timeout" (the
    drain deadline or the hard stop); None: it goes on."""
    if shared[PUBLISHERS_DONE]:
        if complete(shared[EXPECTED]):
            return "complete"
        if now - last_data > idle_ns:
            return "idle"
        if now > shared[DRAIN_DEADLINE]:
            return "timeout"
    return "timeout" if now > hard_stop else None


@dataclass(frozen=True, slots=True)
class Deliveries:
    """What the receiving workers' results add up to, for one case."""

    first_send_ns: int
    last_receive_ns: int
    received: int
    duplicates: int
    rate: float  # received per second, first send to last receive
    p50_ms: float
    p99_ms: float
    drain: str


def drain_outcome(outcomes: set[str]) -> str:
    """The case's drain: the worst of its workers' (timeout, then idle, else complete)."""
    return "timeout" if "timeout" in outcomes else "idle" if "idle" in outcomes else "complete"


def deliveries(pubs: list[dict[str, Any]], subs: list[dict[str, Any]], published: int) -> Deliveries:
    """Sum the publishers' and subscribers' results (ScenarioError when nothing arrived)."""
    first_send = min((r["first_send_ns"] for r in pubs if r["first_send_ns"]), default=0)
    last_receive = max(r["last_receive_ns"] for r in subs)
    received = sum(r["unique"] for r in subs)
    if not first_send or not received:
        raise ScenarioError(f"nothing delivered: published={published} received={received}")
    latencies = sorted(array("q", b"".join(r["latencies"] for r in subs)))
    elapsed = max(1, last_receive - first_send) / 1e9
    return Deliveries(first_send, last_receive, received, sum(r["duplicates"] for r in subs), received / elapsed,
                      latencies[len(latencies) // 2] / 1e6,
                      latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e6,
                      drain_outcome({r["outcome"] for r in subs}))


def split(items: list[Any], parts: int) -> list[list[Any]]:
    return [chunk for chunk in (items[i::parts] for i in range(parts)) if chunk]


def ready_events(sel: selectors.BaseSelector, timeout: float,
                 poll_s: float) -> list[tuple[selectors.SelectorKey, int]]:
    if poll_s and timeout > 0:
        time.sleep(min(timeout, poll_s))
        return sel.select(0)
    return sel.select(timeout)


def quote(text: str) -> str:
    return " ".join(text.replace('"', "'").split())


def parse_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in allowed]
    if unknown or not items:
        raise SystemExit(f"unknown {what}: {','.join(unknown) or text!r} (choose from {','.join(allowed)})")
    return items
