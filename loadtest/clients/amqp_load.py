"""The load generator processes of ``bench_amqp``: publishers (confirmed or not, bounded or
paced, bodies stamped with the send time or not) and consumers (prefetch, manual acks, reading
the stamps or not), each a forked process on raw sockets (``loadtest.clients.amqp_wire``), reporting to
the coordinator through ``loadtest.harness.Workers``."""

from __future__ import annotations

import selectors
import time
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from loadtest.clients.amqp_wire import AMQPClientError, Conn, method_frame, publish_frames
from loadtest.clients.stamps import PAYLOAD_SIZE, StampedFrames, StampLog, latency_result
from loadtest.harness import (
    DELIVERED,
    SLACK_S,
    WORKER_WAIT_S,
    Workers,
    drain_stop,
    ready_events,
)

BODY = bytes(i % 256 for i in range(PAYLOAD_SIZE))  # 64 bytes, as bench_mqtt's payloads
POLL_S = 0.001  # sockets are read every POLL_S (see bench_mqtt.POLL_S)
IDLE_FOR_S = 2.0  # consumers stop when nothing came for this long once the publishers are done
CHANNELS_PER_CONN = 10


@dataclass(frozen=True, slots=True)
class PubLoad:
    """What a publisher process does, as the worker sees it."""

    exchange: str
    routing_key: str
    confirm: bool
    window: int  # confirm: unconfirmed publishes per connection; else publishes per write
    seconds: float
    drain_s: float  # how long after ``seconds`` the last confirms may take
    handshake_s: float
    # The process's publishes stay at most this many ahead of what was taken (0 = no bound):
    # the DELIVERED slots' sum / consumer_channels, i.e. the average consumer channel's
    # deliveries (fanout_topic) or the queue's message_count polled by the coordinator (publish).
    ahead: int = 0
    consumer_channels: int = 1
    poll_s: float = POLL_S  # 0: read on readiness
    rate: float = 0.0  # messages/s per connection, 0 = as fast as the window allows
    stamp: bool = False  # each body starts with (connection index, sequence, send time)


@dataclass(frozen=True, slots=True)
class SubLoad:
    """What a consumer process does: one channel per queue, ``channels_per_conn`` to a connection."""

    prefetch: int
    consume_on_go: bool  # basic.consume when told to go (consume), or before ready (fanout_topic)
    timeout_s: float  # the whole run's bound, on top of which SLACK_S
    handshake_s: float
    poll_s: float = POLL_S  # 0: read on readiness
    stamps: bool = False  # read each body's stamp: latencies, duplicates
    # how the consumer acknowledges (``Conn.acks``): 0 one multiple ack per channel and read,
    # 1 an ack per delivery, N a multiple ack every N deliveries; no_ack: basic.consume no-ack
    ack_every: int = 0
    no_ack: bool = False
    channels_per_conn: int = CHANNELS_PER_CONN


# -- worker processes ------------------------------------------------------------------------------
def publisher_worker(w: Workers, index: int, port: int, connections: int, load: PubLoad) -> None:
    conns: list[Conn] = []
    try:
        for _ in range(connections):
            conns.append(Conn(port, load.handshake_s))
            conns[-1].open_channel(1, confirm=load.confirm)
        w.report("ready", "publisher", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        w.report("result", "publisher", index, pump_publishers(w, conns, load))
        w.release.wait(WORKER_WAIT_S)  # connections stay open until the coordinator has counted
    except Exception as exc:  # noqa: BLE001 - any failure becomes the scenario's error line
        w.report("error", "publisher", index, f"publisher: {type(exc).__name__}: {exc}")
    finally:
        for conn in conns:
            conn.close()


def update_interest(sel: selectors.BaseSelector, conn: Conn, writing: set[Conn]) -> None:
    if (conn.pending is not None) != (conn in writing):
        sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.pending is not None else 0), conn)
        writing.symmetric_difference_update((conn,))


def check(conn: Conn) -> None:
    problem = conn.unexpected()
    if problem:
        raise AMQPClientError(f"broker sent {problem}")


def pump_publishers(w: Workers, conns: list[Conn], load: PubLoad) -> dict[str, Any]:
    frame = publish_frames(1, load.exchange, load.routing_key, BODY)
    size = len(frame)
    block = memoryview(frame * load.window)  # the most one write sends
    # stamped: a buffer per connection, as a write not taken whole still holds its bytes
    stamped = [StampedFrames(frame, size - 1 - len(BODY), i, load.window) for i in range(len(conns))] \
        if load.stamp else []
    per_ns = load.rate / 1e9
    sel = selectors.DefaultSelector()
    for c in conns:
        c.nonblocking()
        sel.register(c.sock, selectors.EVENT_READ, c)
    writing: set[Conn] = set()
    shared = w.shared
    started = time.monotonic_ns()
    stop_sending = started + int(load.seconds * 1e9)
    give_up = stop_sending + int(load.drain_s * 1e9)
    first_send = last_send = 0
    while True:
        now = time.monotonic_ns()
        sending = now < stop_sending
        timeout = 0.05
        allowance = 2**62
        if load.ahead and sending:
            delivered = sum(shared[DELIVERED:]) // load.consumer_channels
            allowance = load.ahead - (sum(c.sent for c in conns) - delivered)
        for i, c in enumerate(conns):
            if c.pending is not None:
                c.flush()
            if c.pending is None and sending:
                room = min(allowance, load.window - c.outstanding if load.confirm else load.window)
                n = room
                if per_ns:
                    n = min(room, int((now - started) * per_ns) + 1 - c.sent)
                    if room > 0:  # wake when the next one is due (epoll rounds up to the millisecond)
                        timeout = min(timeout, max(0.0, (started + (c.sent + max(n, 0)) / per_ns - now) / 1e9))
                if n > 0:
                    allowance -= n
                    c.write(stamped[i].stamp(c.sent, n, now) if stamped else block[: n * size])
                    c.sent += n
                    first_send = first_send or now
                    last_send = now
            update_interest(sel, c, writing)
        if not sending and all(c.pending is None and (not load.confirm or c.outstanding <= 0) for c in conns):
            break
        if now > give_up:
            break
        for key, events in ready_events(sel, timeout, load.poll_s):
            c = key.data
            if events & selectors.EVENT_READ:
                c.on_readable(time.monotonic_ns())
            if events & selectors.EVENT_WRITE:
                c.flush()
        for c in conns:
            check(c)
    sel.close()
    return {
        "sent": sum(c.sent for c in conns),
        "confirmed": sum(c.confirmed for c in conns),
        "nacked": sum(c.nacked for c in conns),
        "first_send_ns": first_send,
        "last_send_ns": last_send,
        "last_confirm_ns": max(c.last_confirm_ns for c in conns),
        "blocked": next((c.blocked for c in conns if c.blocked), ""),
    }


def consumer_worker(w: Workers, index: int, port: int, queues: list[str], load: SubLoad) -> None:
    conns: list[tuple[Conn, list[tuple[int, str]]]] = []
    try:
        per = load.channels_per_conn
        for group in [queues[i:i + per] for i in range(0, len(queues), per)]:
            conn = Conn(port, load.handshake_s)
            channels = list(enumerate(group, 1))
            conns.append((conn, channels))
            for number, queue in channels:
                conn.open_channel(number, prefetch=0 if load.no_ack else load.prefetch)
                if not load.consume_on_go:
                    conn.rpc(number, commands.Basic.Consume(queue=queue, no_ack=load.no_ack), commands.Basic.ConsumeOk)
        w.report("ready", "consumer", index)
        if not w.go.wait(WORKER_WAIT_S) or w.release.is_set():
            return
        w.report("result", "consumer", index, pump_consumers(w, index, conns, load))
        w.release.wait(WORKER_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - any failure becomes the scenario's error line
        w.report("error", "consumer", index, f"consumer: {type(exc).__name__}: {exc}")
    finally:
        for conn, _ in conns:
            conn.close()


def pump_consumers(w: Workers, index: int, conns: list[tuple[Conn, list[tuple[int, str]]]],
                   load: SubLoad) -> dict[str, Any]:
    started = time.monotonic_ns()
    if load.consume_on_go:
        for conn, channels in conns:
            conn.sock.sendall(b"".join(method_frame(n, commands.Basic.Consume(queue=q, no_ack=load.no_ack))
                                       for n, q in channels))
    sel = selectors.DefaultSelector()
    for conn, _ in conns:
        conn.nonblocking()
        sel.register(conn.sock, selectors.EVENT_READ, conn)
        if load.stamps:
            conn.stamps = StampLog()
    writing: set[Conn] = set()
    shared = w.shared
    slot = DELIVERED + index
    channels = sum(len(ch) for _, ch in conns)
    idle_ns = int(IDLE_FOR_S * 1e9)
    last_data = started
    hard_stop = started + int((load.timeout_s + SLACK_S) * 1e9)
    delivered = 0
    outcome = "timeout"
    while True:
        ready = ready_events(sel, 0.05, load.poll_s)
        now = time.monotonic_ns()
        got = 0
        for key, events in ready:
            c = key.data
            if events & selectors.EVENT_READ:
                got += c.on_readable(now)
                acks = b"" if load.no_ack else c.acks(load.ack_every)
                if acks:
                    if c.pending is None:
                        c.write(acks)
                    else:
                        c.pending = memoryview(bytes(c.pending) + acks)
            if c.pending is not None:
                c.flush()
            update_interest(sel, c, writing)
        for c, _ in conns:
            check(c)
        if got:
            delivered += got
            last_data = now
            shared[slot] += got
        stop = drain_stop(shared, now, last_data, idle_ns, hard_stop, lambda expected: delivered >= expected * channels)
        if stop:
            outcome = stop
            break
    sel.close()
    firsts = [c.first_delivery_ns for c, _ in conns if c.first_delivery_ns]
    logs = [c.stamps for c, _ in conns if c.stamps is not None]
    return {
        **(latency_result(logs) if logs else {}),
        "delivered": delivered,
        "start_ns": started,
        "first_delivery_ns": min(firsts, default=0),
        "last_delivery_ns": max(c.last_delivery_ns for c, _ in conns),
        "last_receive_ns": max(c.last_delivery_ns for c, _ in conns),  # for harness.deliveries
        "outcome": outcome,
    }
