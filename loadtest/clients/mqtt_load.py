"""The load generator processes of ``bench_mqtt`` (and ``bench_cluster``): publishers (windowed,
paced or bounded by what the subscribers received), subscribers and idle connections, on raw
sockets with packets pre-encoded by ``loadtest.clients.mqtt_wire``, reporting to the coordinator
through ``loadtest.harness.Workers``."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadtest.clients.mqtt_wire import (
    PublishBatch,
    Publisher,
    Subscriber,
    open_sessions,
)
from loadtest.clients.stamps import latency_result
from loadtest.harness import (
    DELIVERED,
    SLACK_S,
    WORKER_WAIT_S,
    Workers,
    drain_stop,
    ready_events,
)

KEEP_ALIVE = 600  # no PINGREQs in the load: the longest scenario is far shorter
IDLE_FOR_S = 2.0  # subscribers stop once the publishers are done and nothing came for this long
# Throughput scenarios read their sockets every POLL_S rather than on each readiness: a
# loopback segment costs ~10 us of kernel time here, and a broker writes one PUBACK or PUBLISH
# per segment, so waking per segment would cost the generator more than the broker. This adds
# up to POLL_S to their latencies; the latency scenario reads on readiness.
POLL_S = 0.001


@dataclass(frozen=True, slots=True)
class Load:
    """One publish/subscribe run as the worker processes see it."""

    qos: int
    topic_filter: str
    window: int  # unacknowledged QoS 1 PUBLISHes per publisher
    seconds: float  # how long the publishers send
    drain_s: float  # how long after that the subscribers (and QoS 1 publishers) may wait
    handshake_s: float
    max_messages: int = 0  # per publisher, 0 = as many as fit in ``seconds``
    rate: float = 0.0  # messages/s per publisher, 0 = as fast as the window allows
    ahead: int = 0  # at most this many messages ahead of the average subscriber, 0 = no bound
    publishers: int = 1
    subscribers: int = 1
    poll_s: float = POLL_S  # read every poll_s instead of on each readiness, 0 = on readiness


def publisher_worker(w: Workers, index: int, port: int, conns: list[tuple[str, str, int]], load: Load) -> None:
    """Run publishers ``(client id, topic, publisher index)`` on one selector loop."""
    sockets: list[socket.socket] = []
    try:
        sessions = open_sessions(port, [c[0] for c in conns], keep_alive=KEEP_ALIVE, timeout_s=load.handshake_s)
        sockets = sessions.sockets
        if sessions.error:
            kind = "error" if sockets else "refused"
            w.report(kind, "publisher", index, f"publisher handshake: {sessions.error}")
            return
        capacity = max(load.window, 256)
        pubs = [Publisher(sock, PublishBatch(topic, load.qos, number, capacity), load.window)
                for sock, (_, topic, number) in zip(sockets, conns, strict=True)]
        w.report("ready", "publisher", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        w.report("result", "publisher", index, pump_publishers(w, pubs, load))
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the scenario's error line
        w.report("error", "publisher", index, f"publisher: {type(exc).__name__}: {exc}")
    finally:
        for sock in sockets:
            sock.close()


def pump_publishers(w: Workers, pubs: list[Publisher], load: Load) -> dict[str, Any]:
    sel = selectors.DefaultSelector()
    for p in pubs:
        sel.register(p.sock, selectors.EVENT_READ, p)
    writing: set[int] = set()
    started = time.monotonic_ns()
    stop_sending = started + int(load.seconds * 1e9)
    give_up = stop_sending + int(load.drain_s * 1e9)
    per_ns = load.rate / 1e9
    limit = load.max_messages or 2**62
    while True:
        now = time.monotonic_ns()
        sending = now < stop_sending
        timeout = 0.05
        for p in pubs:
            if p.pending is not None:
                p.flush()
            elif sending and p.sent < limit:
                n = min(p.room(), limit - p.sent)
                if per_ns:
                    n = min(n, int((now - started) * per_ns) + 1 - p.sent)
                    timeout = min(timeout, 0.0005)
                if load.ahead:
                    shared = w.shared
                    # this publisher's share of what the average subscriber has received so far
                    delivered = sum(shared[DELIVERED:]) // (load.subscribers * load.publishers)
                    n = min(n, load.ahead - (p.sent - delivered))
                    timeout = min(timeout, 0.001)
                if n > 0:
                    p.send(n, now)
                    if p.pending is None and p.room() > 0 and not per_ns and not load.ahead:
                        timeout = 0  # QoS 0, or a window with room: keep writing
            fd = p.sock.fileno()
            if (p.pending is not None) != (fd in writing):
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if p.pending is not None else 0)
                sel.modify(p.sock, events, p)
                writing.symmetric_difference_update((fd,))
        done_sending = not sending or all(p.sent >= limit for p in pubs)
        if done_sending and all(p.pending is None and (not load.qos or p.acked >= p.sent) for p in pubs):
            break
        if now > give_up:
            break
        for key, events in ready_events(sel, timeout, load.poll_s):
            p = key.data
            if events & selectors.EVENT_READ:
                p.on_readable()
            if events & selectors.EVENT_WRITE:
                p.flush()
    sel.close()
    return {
        "sent": sum(p.sent for p in pubs),
        "acked": sum(p.acked for p in pubs),
        "first_send_ns": min((p.first_send_ns for p in pubs if p.first_send_ns), default=0),
        "last_send_ns": max(p.last_send_ns for p in pubs),
    }


def subscriber_worker(w: Workers, index: int, port: int, client_ids: list[str], load: Load) -> None:
    sockets: list[socket.socket] = []
    try:
        sessions = open_sessions(port, client_ids, keep_alive=KEEP_ALIVE, timeout_s=load.handshake_s,
                                 subscribe=(load.topic_filter, load.qos))
        sockets = sessions.sockets
        if sessions.error:
            kind = "error" if sockets else "refused"
            w.report(kind, "subscriber", index, f"subscriber handshake: {sessions.error}")
            return
        subs = [Subscriber(sock) for sock in sockets]
        w.report("ready", "subscriber", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        w.report("result", "subscriber", index, pump_subscribers(w, index, subs, load))
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the scenario's error line
        w.report("error", "subscriber", index, f"subscriber: {type(exc).__name__}: {exc}")
    finally:
        for sock in sockets:
            sock.close()


def pump_subscribers(w: Workers, index: int, subs: list[Subscriber], load: Load,
                     complete: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Receive until the drain ends (``drain_stop``); ``complete(expected)`` says when every
    subscriber has what it should (default: ``expected`` each)."""
    if complete is None:
        def complete(expected: int) -> bool:
            return all(s.counter.unique >= expected for s in subs)
    sel = selectors.DefaultSelector()
    for s in subs:
        sel.register(s.sock, selectors.EVENT_READ, s)
    writing: set[Subscriber] = set()
    shared = w.shared
    slot = DELIVERED + index
    idle_ns = int(IDLE_FOR_S * 1e9)
    last_data = time.monotonic_ns()
    hard_stop = last_data + int((load.seconds + load.drain_s + SLACK_S) * 1e9)
    outcome = "timeout"
    while True:
        ready = ready_events(sel, 0.05, load.poll_s)
        now = time.monotonic_ns()
        got = 0
        for key, events in ready:
            s = key.data
            if events & selectors.EVENT_READ:
                got += s.on_readable(now)
            elif s.out:
                s.flush()
            if bool(s.out) != (s in writing):
                sel.modify(s.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if s.out else 0), s)
                writing.symmetric_difference_update((s,))
        if got:
            last_data = now
            shared[slot] += got
        stop = drain_stop(shared, now, last_data, idle_ns, hard_stop, complete)
        if stop:
            outcome = stop
            break
    sel.close()
    receiving = [s for s in subs if s.first_receive_ns]
    return {
        **latency_result([s.counter for s in subs]),
        "first_receive_ns": min((s.first_receive_ns for s in receiving), default=0),
        "last_receive_ns": max((s.last_receive_ns for s in receiving), default=0),
        "outcome": outcome,
    }


def idle_worker(w: Workers, index: int, port: int, client_ids: list[str], timeout_s: float) -> None:
    sockets: list[socket.socket] = []
    try:
        w.report("ready", "idle", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        started = time.monotonic_ns()
        sessions = open_sessions(port, client_ids, keep_alive=KEEP_ALIVE, timeout_s=timeout_s)
        sockets = sessions.sockets
        w.report("result", "idle", index, {"opened": len(sockets), "error": sessions.error,
                                           "start_ns": started, "end_ns": time.monotonic_ns()})
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the scenario's error line
        w.report("error", "idle", index, f"idle: {type(exc).__name__}: {exc}")
    finally:
        for sock in sockets:
            sock.close()
