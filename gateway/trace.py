"""Message trace (seed 004): what happened to one message, end to end.

Switched on per listener (``trace = "mqtt,amqp"``; ``all``), the gateway records for each
message its clients publish or receive:

- ``publish``: client, protocol, topic, size, keys, when the gateway read it;
- ``store``: when the store made it durable, how long that took, the queues it was indexed into;
- ``deliver``: to which client or consumer, from which queue and offset, when;
- ``ack``: when that client acknowledged it (MQTT PUBACK/PUBCOMP, AMQP basic.ack).

As RocketMQ's trace, events are not written one by one on the message path: producers append a
tuple to a list (nothing else), and a background task writes them in batches as ordinary
records of the system trace topic in the same store (queue ``sys:trace``). Each record's keys
are the message ids it has events for plus the publishers' keys, so the store's key index finds
a message's trace by id, and a message by its key; a trace therefore survives restarts and is
removed by retention like any other record.

Events are kept compact until written (message positions, not ids; monotonic-free wall
times), and the batch is one JSON array of arrays: cheap to make in C, readable by ``jq``. If
the store cannot keep up, events beyond ``max_pending`` are dropped and counted, never the
messages themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from store import Message, MessageStore, PutResult, StoreError

log = logging.getLogger("tidemq.trace")

TRACE_TOPIC = "tidemq.trace"
TRACE_QUEUE = "sys:trace"
LISTENERS = ("mqtt", "mqtts", "ws", "amqp", "remoting")

# the fields of each event type after (type, msg_id, time, protocol, client)
_FIELDS: dict[str, tuple[str, ...]] = {
    "publish": ("topic", "size", "keys"),
    "store": ("cost_ms", "store_timestamp", "queues"),
    "deliver": ("queue", "offset", "qos"),
    "ack": ("queue", "offset"),
}


def parse_listeners(text: str) -> frozenset[str]:
    """``"mqtt, amqp"`` -> the listeners whose traffic is traced; ``all`` is every listener."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    if "all" in names:
        return frozenset(LISTENERS)
    unknown = names - set(LISTENERS)
    if unknown:
        raise ValueError(f"unknown listener(s) {', '.join(sorted(unknown))}; use {', '.join(LISTENERS)} or all")
    return frozenset(names)


class Tracer:
    """Collects trace events in memory and writes them to the trace topic in batches."""

    def __init__(self, store: MessageStore, *, flush_interval_s: float = 0.1, batch_events: int = 512,
                 max_pending: int = 200_000) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.batch_events = batch_events
        self.max_pending = max_pending
        self._events: list[tuple] = []
        self._task: asyncio.Task[None] | None = None
        self._id_prefix = store.msg_id_prefix
        self.events_written = 0
        self.events_dropped = 0

    # -- producers: called on the message paths, each a tuple append ------------------------
    def _add(self, event: tuple) -> None:
        if len(self._events) >= self.max_pending:
            self.events_dropped += 1
            return
        self._events.append(event)

    def watch_put(self, protocol: str, client: str, items: list[tuple[Message, Sequence[str]]],
                  put: asyncio.Future[list[PutResult]]) -> None:
        """Record the publish and store events of ``items`` (a client's messages, read now)
        when ``put`` (their store put) has made them durable."""
        put.add_done_callback(partial(self._stored, protocol, client, items, time.time()))

    def _stored(self, protocol: str, client: str, items: list[tuple[Message, Sequence[str]]], received_at: float,
                put: asyncio.Future[list[PutResult]]) -> None:
        if put.cancelled() or put.exception() is not None:
            return
        events = self._events
        if len(events) + 2 * len(items) > self.max_pending:
            self.events_dropped += 2 * len(items)
            return
        stored_at = time.time()
        cost_ms = round((stored_at - received_at) * 1000, 3)
        for (message, _), result in zip(items, put.result()):
            position = result.position
            events.append(("publish", position, received_at, protocol, client, message.topic, len(message.body),
                           message.key))
            events.append(("store", position, stored_at, protocol, client, cost_ms, result.store_timestamp,
                           list(result.queue_offsets)))

    def delivered(self, protocol: str, client: str, position: int, queue: str, offset: int, qos: int) -> None:
        self._add(("deliver", position, time.time(), protocol, client, queue, offset, qos))

    def acked(self, protocol: str, client: str, position: int, queue: str, offset: int) -> None:
        self._add(("ack", position, time.time(), protocol, client, queue, offset))

    @property
    def pending(self) -> int:
        return len(self._events)

    # -- the writer -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="trace-writer")

    async def stop(self) -> None:
        """Write what is pending (before the store closes)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except StoreError as exc:  # the store refuses writes (stopping, disk full): drop this batch
                log.warning("trace events not written count=%d error=%s", len(self._events), exc)

    async def flush(self) -> None:
        """Write every pending event now, ``batch_events`` per record, in one store batch."""
        events, self._events = self._events, []
        if not events:
            return
        size = self.batch_events
        records = [self._record(events[i:i + size]) for i in range(0, len(events), size)]
        await self.store.put_batch([(record, (TRACE_QUEUE,)) for record in records])
        self.events_written += len(events)

    def _record(self, events: list[tuple]) -> Message:
        prefix = self._id_prefix
        rows = []
        keys: dict[str, None] = {}
        for event in events:
            msg_id = f"{prefix}{event[1]:016X}"
            keys[msg_id] = None
            if event[0] == "publish" and event[7]:
                keys.update(dict.fromkeys(event[7].split(" ")))
            rows.append([event[0], msg_id, round(event[2] * 1000, 3), *event[3:]])
        return Message(TRACE_TOPIC, json.dumps(rows, separators=(",", ":")).encode(), key=" ".join(keys))


# -- reading traces back ------------------------------------------------------------------------
def _event(row: list[Any]) -> dict[str, Any] | None:
    fields = _FIELDS.get(row[0]) if row else None
    if fields is None or len(row) != 5 + len(fields):
        return None
    event = {"type": row[0], "msg_id": row[1], "time": row[2], "protocol": row[3], "client": row[4]}
    event.update(zip(fields, row[5:]))
    return event


def _events_of_records(store: MessageStore, key: str, max_records: int) -> list[dict[str, Any]]:
    events = []
    for record in store.query_by_key(TRACE_TOPIC, key, max_messages=max_records):
        try:
            rows = json.loads(record.body)
        except ValueError:
            log.warning("unreadable trace record position=%d", record.position)
            continue
        for row in rows:
            event = _event(row) if isinstance(row, list) else None
            if event is not None:
                events.append(event)
    return events


def trace_of(store: MessageStore, msg_id: str, *, max_records: int = 256) -> list[dict[str, Any]]:
    """Every recorded event of one message, oldest first."""
    events = [e for e in _events_of_records(store, msg_id, max_records) if e["msg_id"] == msg_id]
    events.sort(key=lambda e: e["time"])
    return events


def traces_by_key(store: MessageStore, key: str, *, max_messages: int = 16) -> list[dict[str, Any]]:
    """The events of every traced message published with ``key`` (the newest ``max_messages``)."""
    msg_ids: dict[str, None] = {}
    for event in _events_of_records(store, key, 64):
        if event["type"] == "publish" and event.get("keys") and key in event["keys"].split(" "):
            msg_ids[event["msg_id"]] = None
    events = []
    for msg_id in list(msg_ids)[-max_messages:]:
        events.extend(trace_of(store, msg_id))
    events.sort(key=lambda e: e["time"])
    return events
