"""Message trace (seed 004): what happened to one message, end to end.

Switched on per listener (``trace = "mqtt,amqp"``; ``all``), the gateway records for each
message its clients publish or receive:

- ``publish``: client, protocol, topic, size, keys, when the gateway read it;
- ``store``: when the store made it durable, how long that took, the queues (and offsets) it
  was indexed into;
- ``deliver``: to which client or consumer, from which queue and offset, when;
- ``ack``: when that client acknowledged it (MQTT PUBACK/PUBCOMP, AMQP basic.ack).

As RocketMQ's trace, events are not written one by one on the message path. A producer appends
one tuple to a list (publish and store are one tuple: both are known when the put completes);
a background task writes the list every 100 ms as records of the system trace topic in the same
store (queue ``sys:trace``). A record's body is the list of those tuples, pickled (protocol 5,
all C: 0.65 us per traced message where JSON took 7 us and formatting each event in Python
14.5 us, which halved the MQTT fan-in rate). It is read back by an unpickler that refuses every
global, so only plain data (tuples, strings, numbers, dicts) can come out of it, and only from
records of the trace queue, which no client can write to. Its keys name the stretches of
commitlog its messages are in (``BUCKET_BITS``), plus their publishers' keys, so the store's
key index finds a message's trace by id (an id names a commitlog position) and by the key it
was published with. A trace therefore survives restarts and is removed by retention like any
other record.

If the store cannot keep up, events beyond ``max_pending`` are dropped and counted, never the
messages themselves.
"""

from __future__ import annotations

import asyncio
import io
import logging
import pickle
import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from store import Message, MessageStore, PutResult, StoredMessage, StoreError
from store import decode_msg_id

log = logging.getLogger("tidemq.trace")

TRACE_TOPIC = "tidemq.trace"
# A trace record is keyed by the 16 KiB stretches of commitlog its messages are in, not by each
# message: one index entry per message cost 1.8 us per traced message (more than everything
# else together); a query reads the few records of the stretch and keeps the message's rows.
BUCKET_BITS = 14
TRACE_QUEUE = "sys:trace"
LISTENERS = ("mqtt", "mqtts", "ws", "amqp", "remoting")

# a stored row is the producer's tuple: (type, position, time_s, protocol, client, *fields).
# A publish row is the publish and the store event; what the stored message itself says (topic,
# size, queues, store time) is read from it when a trace is asked for, not written again.
_FIELDS: dict[str, tuple[str, ...]] = {
    "publish": ("stored_at", "keys"),
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

    def __init__(self, store: MessageStore, *, flush_interval_s: float = 0.1, batch_events: int = 4096,
                 max_pending: int = 200_000) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self.batch_events = batch_events  # per record (a record stays well under the message size limit)
        self.max_pending = max_pending
        self._events: list[tuple] = []
        self._keyed: list[tuple[int, str]] = []  # (index in _events, keys) of publishes with keys
        self._task: asyncio.Task[None] | None = None
        self.rows_written = 0  # one row per publish (its publish and store events), delivery, ack
        self.rows_dropped = 0

    # -- producers: called on the message paths, each a tuple append ------------------------
    def watch_put(self, protocol: str, client: str, items: Sequence[tuple[Message, Sequence[str]]],
                  put: asyncio.Future[Sequence[PutResult]], received_at: float | None = None) -> None:
        """Record the publish and store events of ``items`` (a client's messages, read at
        ``received_at``, None: now) when ``put`` (their store put) has made them durable."""
        put.add_done_callback(partial(self._stored, protocol, client, items,
                                      time.time() if received_at is None else received_at))

    def _stored(self, protocol: str, client: str, items: Sequence[tuple[Message, Sequence[str]]], received_at: float,
                put: asyncio.Future[Sequence[PutResult]]) -> None:
        if put.cancelled() or put.exception() is not None:
            return
        events = self._events
        if len(events) + len(items) > self.max_pending:
            self.rows_dropped += len(items)
            return
        stored_at = time.time()
        for (message, _), result in zip(items, put.result()):
            key = message.key
            if key:
                self._keyed.append((len(events), key))
            events.append(("publish", result.position, received_at, protocol, client, stored_at, key))

    def delivered(self, protocol: str, client: str, position: int, queue: str, offset: int, qos: int) -> None:
        if len(self._events) >= self.max_pending:
            self.rows_dropped += 1
            return
        self._events.append(("deliver", position, time.time(), protocol, client, queue, offset, qos))

    def acked(self, protocol: str, client: str, position: int, queue: str, offset: int) -> None:
        if len(self._events) >= self.max_pending:
            self.rows_dropped += 1
            return
        self._events.append(("ack", position, time.time(), protocol, client, queue, offset))

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
                log.warning("trace events not written error=%s", exc)

    async def flush(self) -> None:
        """Write every pending event now, ``batch_events`` per record, in one store batch."""
        events, keyed = self._events, self._keyed
        if not events:
            return
        self._events, self._keyed = [], []
        size = self.batch_events
        records = []
        for start in range(0, len(events), size):
            chunk = events[start:start + size]
            keys = " ".join([f"@{bucket:x}" for bucket in {row[1] >> BUCKET_BITS for row in chunk}])
            user_keys = [k for i, k in keyed if start <= i < start + size]
            if user_keys:
                keys += " " + " ".join(user_keys)
            records.append(Message(TRACE_TOPIC, pickle.dumps(chunk, protocol=5), key=keys))
        await self.store.put_batch([(record, (TRACE_QUEUE,)) for record in records])
        self.rows_written += len(events)


# -- reading traces back ------------------------------------------------------------------------
class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"trace records hold plain data, not {module}.{name}")


def rows_of(record: StoredMessage) -> list[tuple[Any, ...]]:
    """The rows of one trace record ([] for one that is not readable as such, logged)."""
    try:
        rows = _DataOnly(io.BytesIO(record.body)).load()
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, IndexError, KeyError) as exc:
        log.warning("unreadable trace record position=%d error=%s", record.position, exc)
        return []
    return [row for row in rows if isinstance(row, tuple)] if isinstance(rows, list) else []


def _events(store: MessageStore, row: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The events of one stored row ([] for a row this version does not know)."""
    fields = _FIELDS.get(row[0]) if row else None
    if fields is None or len(row) != 5 + len(fields):
        return []
    kind, position, time_s, protocol, client = row[:5]
    base = {"msg_id": f"{store.msg_id_prefix}{position:016X}", "protocol": protocol, "client": client}
    values = dict(zip(fields, row[5:]))
    if kind != "publish":
        return [{"type": kind, "time": _ms(time_s), **base, **values}]
    stored_at = values["stored_at"]
    publish = {"type": "publish", "time": _ms(time_s), **base, "keys": values["keys"]}
    stored = {"type": "store", "time": _ms(stored_at), **base, "cost_ms": round((stored_at - time_s) * 1000, 3)}
    message = store.read_at(position)
    if message is not None:  # (else removed by retention)
        publish.update(topic=message.topic, size=len(message.body))
        stored.update(store_timestamp=message.store_timestamp, queues=dict(message.queues))
    return [publish, stored]


def _ms(time_s: float) -> float:
    return round(time_s * 1000, 3)


def _rows(store: MessageStore, key: str, max_records: int) -> Iterator[tuple[Any, ...]]:
    """The rows of the trace records stored with ``key``."""
    for record in store.query_by_key(TRACE_TOPIC, key, max_messages=max_records):
        if any(queue == TRACE_QUEUE for queue, _ in record.queues):  # (not a client's message called so)
            yield from rows_of(record)


def trace_of(store: MessageStore, msg_id: str, *, max_records: int = 256) -> list[dict[str, Any]]:
    """Every recorded event of one message, oldest first ([] for an id that is not one)."""
    try:
        _, _, position = decode_msg_id(msg_id)
    except ValueError:
        return []
    events = []
    for row in _rows(store, f"@{position >> BUCKET_BITS:x}", max_records):
        if len(row) > 1 and row[1] == position:
            events.extend(_events(store, row))
    events.sort(key=lambda e: e["time"])
    return events


def traces_by_key(store: MessageStore, key: str, *, max_messages: int = 16) -> list[dict[str, Any]]:
    """The events of every traced message published with ``key`` (the newest ``max_messages``)."""
    if not key or " " in key:
        return []
    positions: dict[int, None] = {}
    for row in _rows(store, key, 64):
        if row[0] == "publish" and len(row) == 7 and isinstance(row[6], str) and key in row[6].split(" "):
            positions[row[1]] = None
    events = []
    for position in list(positions)[-max_messages:]:
        events.extend(trace_of(store, f"{store.msg_id_prefix}{position:016X}"))
    events.sort(key=lambda e: e["time"])
    return events
