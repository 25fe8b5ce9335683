"""A rule's webhook target down while events match: what is lost, what comes out of order, the
gateway's memory while the backlog grows, and how soon delivery resumes when the target returns.

    python -m loadtest.rules_outage [--minutes M] [--events N] [--devices D] [--tracemalloc] [--out FILE]

A gateway process (``python -m gateway serve``, a temporary data dir) runs one rule: source
``meters/#``, a pattern on the payload, a webhook target (an aiohttp server in its own process)
and a retry policy that never gives up (the default backoff). After a warm-up with the target up,
the target's port is closed; ``--devices`` MQTT clients (paho, QoS 1, each its own topic
``meters/{device}``) publish ``--events`` JSON events ``{"d": device, "n": seq}`` spread over
``--minutes``; then the target listens again on the same port and the backlog drains. One line:

    rules scenario=outage minutes=M events=N lost=... out_of_order=... duplicates=...
        rss_before_mb=... rss_peak_mb=... rss_after_mb=... anon_before_mb=... anon_after_mb=...
        lag_at_return=... resume_s=... drain_events_per_s=... queue_cache_mb=A->B memtable_mb=A->B
        block_cache_mb=A->B

``lost``: events acknowledged (PUBACK) that the webhook never got; ``out_of_order``: events a
device's sequence brought after a later one of the same device (the rule's one source queue
keeps each client's order); ``duplicates``: deliveries beyond an event's first; ``rss_*``: the
gateway's resident memory after the warm-up, at its highest during the outage and when the
target returns; ``anon_*``: the part of it that is not mapped files (the heap); ``resume_s``: from the target listening again to its first event.

``queue_cache_mb``, ``memtable_mb``, ``block_cache_mb``: the gateway's gauges of the memory it
bounds by configuration (the queue cache's windows; RocksDB's write buffers and block cache,
native memory), after the warm-up -> at the outage's end.
``--tracemalloc`` runs the gateway with Python's allocations traced (``loadtest.traced_gateway``)
and adds ``traced_before_mb=... traced_after_mb=...`` (Python's own memory; the rest of RSS is
native: RocksDB, mapped segments, the allocator's free lists) and, as ``# grew`` lines, the
lines of code whose allocations grew most from the warm-up to the outage's end.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho

from loadtest import runner

RULE = "outage"
WARMUP_EVENTS = 1000
WINDOW = 64  # unacknowledged QoS 1 publishes per device
DRAIN_IDLE_S = 60.0  # the drain gives up when nothing new came for this long
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- the target ---------------------------------------------------------------------------------
def serve_webhook(events_port: int, control_port: int, ready: Any) -> None:
    """The webhook's process: ``/events`` on ``events_port`` (closed by ``POST /down`` on the
    control port, opened again by ``POST /up``), ``GET /stats`` on the control port."""
    import asyncio

    from aiohttp import web

    seen: set[tuple[int, int]] = set()
    last: dict[int, int] = {}
    state: dict[str, Any] = {"count": 0, "out_of_order": 0, "up_at": None, "resume_s": None, "down": False}

    async def events(request: web.Request) -> web.Response:
        if state["down"]:  # (a request on a connection open before the port closed: dropped)
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPServiceUnavailable()
        event = json.loads(await request.read())
        key = (event["d"], event["n"])
        state["count"] += 1
        if key not in seen:
            if event["n"] < last.get(event["d"], -1):
                state["out_of_order"] += 1
            last[event["d"]] = max(last.get(event["d"], -1), event["n"])
            seen.add(key)
        if state["up_at"] is not None and state["resume_s"] is None:
            state["resume_s"] = time.monotonic() - state["up_at"]
        return web.Response(status=204)

    async def main() -> None:
        events_app = web.Application()
        events_app.router.add_post("/events", events)
        events_runner = web.AppRunner(events_app, access_log=None)
        await events_runner.setup()
        site: list[web.TCPSite] = [web.TCPSite(events_runner, "127.0.0.1", events_port, reuse_address=True)]
        await site[0].start()

        async def down(request: web.Request) -> web.Response:
            state["down"] = True
            await site[0].stop()  # (no new connections: refused)
            for handler in list(events_runner.server.connections if events_runner.server else ()):
                handler.force_close()  # (the rule's keep-alive connections: closed)
            return web.json_response({})

        async def up(request: web.Request) -> web.Response:
            site[0] = web.TCPSite(events_runner, "127.0.0.1", events_port, reuse_address=True)
            await site[0].start()
            state["up_at"], state["resume_s"], state["down"] = time.monotonic(), None, False
            return web.json_response({})

        async def stats(request: web.Request) -> web.Response:
            return web.json_response({**state, "distinct": len(seen)})

        control = web.Application()
        control.router.add_post("/down", down)
        control.router.add_post("/up", up)
        control.router.add_get("/stats", stats)
        control_runner = web.AppRunner(control, access_log=None)
        await control_runner.setup()
        await web.TCPSite(control_runner, "127.0.0.1", control_port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def http(method: str, url: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


# -- the gateway ----------------------------------------------------------------------------------
def start_gateway(data_dir: Path, mqtt_port: int, http_port: int, *, traced: bool = False) -> subprocess.Popen:
    """The gateway's process (``traced``: under ``loadtest.traced_gateway``, its snapshots in
    the data dir's parent)."""
    log = open(data_dir.parent / "gateway.log", "w")  # noqa: SIM115 (the process's stderr, for its life)
    module = "loadtest.traced_gateway" if traced else "gateway"
    proc = subprocess.Popen([sys.executable, "-m", module, "serve", "--data-dir", str(data_dir),
                             "--mqtt-bind", f"127.0.0.1:{mqtt_port}", "--metrics-bind", f"127.0.0.1:{http_port}",
                             "--amqp-bind", "", "--remoting-bind", ""],
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "TRACED_GATEWAY_SNAPSHOTS": str(data_dir.parent)})
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2).close()
            return proc
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not start: see {data_dir.parent / 'gateway.log'}") from None
            time.sleep(0.1)


MEMORY_GAUGES = {"queue_cache": "tidemq_queue_cache_bytes", "memtable": "tidemq_store_memtable_bytes",
                 "block_cache": "tidemq_store_block_cache_bytes"}


def memory_gauges(admin: str) -> dict[str, float]:
    """The gateway's own accounts of its bounded memory (MB): the queue cache's windows, RocksDB's
    write buffers and block cache (native memory)."""
    text = urllib.request.urlopen(admin + "/metrics", timeout=30).read().decode()
    wanted = set(MEMORY_GAUGES.values())
    values = {name: float(value) for name, _, value in (line.rpartition(" ") for line in text.splitlines())
              if name in wanted}
    return {name: values.get(metric, 0.0) / 2**20 for name, metric in MEMORY_GAUGES.items()}


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory (``RssAnon``: its heap and other private memory, without the
    file pages it maps, such as the store's segments)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssPeak:
    """The highest resident memory of a process, sampled every ``interval_s`` in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __enter__(self) -> RssPeak:
        self.peak = rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def traced_snapshot(proc: subprocess.Popen, folder: Path, number: int) -> tracemalloc.Snapshot:
    """The traced gateway's snapshot ``number`` (asked for by SIGUSR1)."""
    proc.send_signal(signal.SIGUSR1)
    path = folder / f"snapshot-{number}.pickle"
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("the traced gateway wrote no snapshot")
        time.sleep(0.1)
    return tracemalloc.Snapshot.load(str(path))


def traced_mb(snapshot: tracemalloc.Snapshot) -> float:
    return sum(stat.size for stat in snapshot.statistics("filename")) / 2**20


def growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int = 15) -> list[str]:
    """The lines of code whose allocations grew most between the snapshots."""
    return [f"# grew {diff.size_diff / 2**20:+.2f} MB in {diff.count_diff:+d} blocks at "
            f"{' <- '.join(f'{Path(f.filename).name}:{f.lineno}' for f in diff.traceback)}"
            for diff in after.compare_to(before, "traceback")[:top]]


# -- the devices ----------------------------------------------------------------------------------
def publish_device(port: int, device: int, first: int, count: int, seconds: float, acked: list[int]) -> None:
    """``count`` events of ``device`` numbered from ``first``, paced over ``seconds``, QoS 1 with
    at most WINDOW unacknowledged; ``acked[device]``: how many were acknowledged."""
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"meter-{device}", protocol=paho.MQTTv311)
    client.max_inflight_messages_set(WINDOW)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port, keepalive=600)
    client.loop_start()
    try:
        pending: list[paho.MQTTMessageInfo] = []
        started = time.monotonic()
        for i in range(count):
            due = started + seconds * i / count
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pending.append(client.publish(f"meters/{device}", json.dumps({"d": device, "n": first + i}), 1))
            if len(pending) >= WINDOW:
                acked[device] += acknowledged(pending.pop(0))
        for info in pending:
            acked[device] += acknowledged(info)
    finally:
        client.disconnect()
        client.loop_stop()


def acknowledged(info: paho.MQTTMessageInfo) -> int:
    """1 once the publish's PUBACK came (within a minute), else 0."""
    try:
        info.wait_for_publish(60)
    except (RuntimeError, ValueError):  # (the connection was lost)
        return 0
    return int(info.is_published())


def publish_all(port: int, devices: int, first: int, per_device: int, seconds: float) -> int:
    """Every device's events at once (a thread each); the number acknowledged."""
    acked = [0] * devices
    threads = [threading.Thread(target=publish_device, args=(port, d, first, per_device, seconds, acked))
               for d in range(devices)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(acked)


# -- the run --------------------------------------------------------------------------------------
def run(minutes: float, events: int, devices: int, lines: runner.Lines, *, traced: bool = False) -> None:
    events_port, control_port, mqtt_port, http_port = free_port(), free_port(), free_port(), free_port()
    ready = multiprocessing.Event()
    hook = multiprocessing.Process(target=serve_webhook, args=(events_port, control_port, ready), daemon=True)
    hook.start()
    if not ready.wait(30):
        raise SystemExit("the webhook did not start")
    control, admin = f"http://127.0.0.1:{control_port}", f"http://127.0.0.1:{http_port}"
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        gateway = start_gateway(data_dir, mqtt_port, http_port, traced=traced)
        try:
            http("POST", admin + "/admin/rules", {
                "name": RULE, "sources": ["meters/#"], "pattern": {"data": {"n": [{"numeric": [">=", 0]}]}},
                "targets": [{"type": "webhook", "url": f"http://127.0.0.1:{events_port}/events", "timeout_s": 5}],
                "retry": {"max_attempts": 1_000_000, "max_age_s": 30 * 86_400}})  # (the default backoff)
            per_warmup = max(1, WARMUP_EVENTS // devices)
            acked = publish_all(mqtt_port, devices, 0, per_warmup, 1.0)
            wait_for(control, acked, 60)
            rss_before, anon_before = rss_mb(gateway.pid), rss_mb(gateway.pid, "RssAnon")
            gauges_before = memory_gauges(admin)
            first = traced_snapshot(gateway, Path(tmp), 0) if traced else None
            http("POST", control + "/down")
            per_device = max(1, events // devices)
            outage_s = minutes * 60
            started = time.monotonic()
            with RssPeak(gateway.pid) as peak:
                acked += publish_all(mqtt_port, devices, per_warmup, per_device, outage_s * 0.9)
                time.sleep(max(0.0, started + outage_s - time.monotonic()))
                rss_after, anon_after = rss_mb(gateway.pid), rss_mb(gateway.pid, "RssAnon")
            gauges_after = memory_gauges(admin)
            last = traced_snapshot(gateway, Path(tmp), 1) if traced else None
            lag = http("GET", admin + f"/admin/rules/{RULE}")["lag"]
            http("POST", control + "/up")
            returned = time.monotonic()
            stats = wait_for(control, acked, DRAIN_IDLE_S)
            drain_s = time.monotonic() - returned
            total = devices * (per_warmup + per_device)
            resume = stats["resume_s"]
            lines.emit(f"rules scenario=outage minutes={minutes:g} events={devices * per_device} devices={devices} "
                       f"acked={acked} lost={acked - stats['distinct']} out_of_order={stats['out_of_order']} "
                       f"duplicates={stats['count'] - stats['distinct']} rss_before_mb={rss_before:.0f} "
                       f"rss_peak_mb={peak.peak:.0f} rss_after_mb={rss_after:.0f} anon_before_mb={anon_before:.0f} "
                       f"anon_after_mb={anon_after:.0f} lag_at_return={lag} "
                       f"resume_s={resume if resume is None else f'{resume:.2f}'} "
                       f"drain_events_per_s={(total - per_warmup * devices) / drain_s:.0f} "
                       + " ".join(f"{name}_mb={gauges_before[name]:.1f}->{gauges_after[name]:.1f}"
                                  for name in MEMORY_GAUGES)
                       + (f" traced_before_mb={traced_mb(first):.1f} traced_after_mb={traced_mb(last):.1f}"
                          if first is not None and last is not None else ""))
            if first is not None and last is not None:
                for line in growth(first, last):
                    lines.emit(line)
        finally:
            gateway.terminate()
            try:
                gateway.wait(30)
            except subprocess.TimeoutExpired:
                gateway.kill()
            hook.kill()
            hook.join()


def wait_for(control: str, distinct: int, idle_s: float) -> dict[str, Any]:
    """The webhook's stats once it has ``distinct`` events, or nothing new came for ``idle_s``."""
    stats = http("GET", control + "/stats")
    progressed = time.monotonic()
    while stats["distinct"] < distinct and time.monotonic() - progressed < idle_s:
        time.sleep(0.05)
        before = stats["count"]
        stats = http("GET", control + "/stats")
        if stats["count"] != before:
            progressed = time.monotonic()
    return stats


def main() -> None:
    parser = runner.parser(__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the target is down (10)")
    parser.add_argument("--events", type=int, default=500_000, help="events published while it is down (500000)")
    parser.add_argument("--devices", type=int, default=16, help="MQTT publishers, one topic each (16)")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the gateway's Python allocations")
    args = parser.parse_args()
    with runner.Lines(args.out) as lines:
        run(args.minutes, args.events, args.devices, lines, traced=args.tracemalloc)


if __name__ == "__main__":
    main()
