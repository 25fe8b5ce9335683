"""The data API's write side: ``POST /data/publish`` stores a batch of rows as MQTT messages,
through the MQTT broker's publish path, for the Spark sink (``spark_sinks/writer.py``) and any
other bulk writer. Routed by ``gateway/http/data_api.py`` on the metrics listener (``admin_token``).

    POST /data/publish?writer=W&batch=B&partition=P&chunk=C[&qos=1][&retain=false]
    Content-Type: application/vnd.apache.arrow.stream   (or application/x-ndjson)

Rows: ``topic`` (string) and ``payload`` (binary or string) are required; ``qos`` (0-2) and
``retain`` (bool) override the query's defaults per row (null: the default); ``properties``
(map string -> string) become MQTT 5.0 user properties and ``key`` the message key (the user
property ``key``, as an MQTT client would set it). Each row is stored as if an MQTT client
``data-api:{writer}`` had published it: one commitlog append indexed into its topic queue,
every matching wildcard queue and the AMQP queues bound to ``amq.topic``
(``broker.wildcards.queues_for``), retained when asked, with the MQTT flag and QoS -- so MQTT
subscribers and AMQP apps get it exactly as from a device.

Why Arrow IPC: Spark hands a Python writer Arrow record batches, so an executor sends what it
has without a per-row Python step, binary payloads need no base64, and the gateway already
speaks Arrow on the read side. JSON lines (``payload`` as text or ``payload_base64``) are
accepted too, for ``curl`` and writers without pyarrow.

Idempotence, at least once: a request with ``writer`` names a batch key
``{writer}/{batch}/{partition}/{chunk}`` (Spark: query id, micro-batch id, task partition,
chunk of the partition's rows). The key is remembered in the store's KV table ``data.publish``
after the put is durable, with the answer; a request whose key is there is answered with the
remembered answer (``"duplicate": true``) and stores nothing. Requests with the same key wait
for each other. A crash (or a failed KV write) after the put and before the key is remembered
stores the batch again when Spark retries: at least once, never lost. Keys are forgotten two
batches later (a Spark query never re-runs a batch older than its last one: when batch N of a
writer arrives, keys below N-1 go) or after ``KEY_TTL_S`` for writers that stopped. In a
cluster, gateway nodes publish (the store node runs no MQTT: 503) and the keys live in the store
node's table, read over the store link; a gateway node forgets the keys it stored itself only
(no listing, no TTL sweep over the link), so keys another node or an earlier process left stay.

A row that cannot be published (no topic, an invalid MQTT topic name or one starting with ``$``,
a null payload, a payload larger than the MQTT ``max_packet_size``, a bad QoS) is left out and
reported with its row number in ``errors``; the other rows are stored. The answer:
``{"rows", "stored", "bad_rows", "errors": [{"row", "topic", "error"}], "duplicate", "key"}``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, Metric

from protocols.mqtt.packets import Publish
from protocols.mqtt.properties import EMPTY_PROPERTIES, Properties
from protocols.mqtt.topics import TopicError, validate_topic_name
from store import StoreError

from ..mqtt.messages import KEY_PROPERTY
from .data_access import PRINCIPAL, DataAccess
from .errors import AdminError

if TYPE_CHECKING:
    from ..mqtt.broker import MQTTBroker
    from ..ports import KeyValueTable
    from ..pressure import StorePressure
    from .deps import Status

log = logging.getLogger("tidemq.data")

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON_LINES = ("application/x-ndjson", "application/jsonl", "application/json-lines")
KEYS_TABLE = "data.publish"
MAX_BODY_BYTES = 32 << 20  # per request; the Spark sink sends 8 MiB chunks
MAX_ROWS = 100_000  # per request
MAX_ERRORS = 100  # row errors listed in an answer (all are counted)
MAX_CONCURRENT = 4  # requests past reading their body: bounds the memory held
KEY_TTL_S = 7 * 24 * 3600.0  # keys of writers that stopped are forgotten after this
PRUNE_INTERVAL_S = 3600.0
PUT_SLICE = 512  # rows handed to the store at once: their messages are built on the loop (~20 ms lag at most)
PACKET_OVERHEAD = 16  # a PUBLISH's fixed header, topic length and packet id, roughly
COLUMNS = ("topic", "payload", "qos", "retain", "properties", "key")


@dataclass(slots=True)
class Decoded:
    """A request's rows: the publishes to store and the rows left out, with why."""

    rows: int
    publishes: list[Publish] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    bad_rows: int = 0

    def reject(self, row: int, topic: Any, error: str) -> None:
        self.bad_rows += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"row": row, "topic": topic[:200] if isinstance(topic, str) else None, "error": error})


@dataclass(slots=True)
class PublishStats:
    requests: int = 0
    rows_stored: int = 0
    rows_bad: int = 0
    duplicates: int = 0  # requests answered from a remembered key


@dataclass(slots=True)
class _KeyLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class BadRequest(ValueError):
    """The request as a whole cannot be read (not a row problem)."""


def decode_rows(body: bytes, content_type: str, *, qos: int, retain: bool, max_packet: int) -> Decoded:
    """The rows of a request body as publishes (runs in a worker thread: no loop state)."""
    if content_type == ARROW_STREAM:
        columns = _arrow_columns(body)
    elif content_type in JSON_LINES:
        columns = _json_columns(body)
    else:
        raise BadRequest(f"send {ARROW_STREAM} or application/x-ndjson, not {content_type or 'no content type'}")
    rows = len(columns["topic"])
    if rows > MAX_ROWS:
        raise BadRequest(f"at most {MAX_ROWS} rows per request, not {rows}")
    out = Decoded(rows)
    n = [None] * rows
    for i, topic, payload, row_qos, row_retain, props, key, unreadable in zip(
            range(rows), columns["topic"], columns["payload"], columns.get("qos", n), columns.get("retain", n),
            columns.get("properties", n), columns.get("key", n), columns.get("_error", n)):
        if isinstance(payload, str):
            payload = payload.encode()
        error = unreadable or _row_error(topic, payload, row_qos, row_retain, max_packet)
        if error is None:
            pairs, error = _user_properties(props, key)
        if error is not None:
            out.reject(i, topic, error)
            continue
        properties = Properties(user_properties=pairs) if pairs else EMPTY_PROPERTIES
        out.publishes.append(Publish(topic, payload, qos if row_qos is None else row_qos,
                                     retain if row_retain is None else bool(row_retain), properties=properties))
    return out


def _user_properties(props: Any, key: Any) -> tuple[list[tuple[str, str]], str | None]:
    """A row's properties (a JSON object, or an Arrow map's pairs) and key as MQTT user properties."""
    if props is None:
        pairs = []
    elif isinstance(props, dict):
        pairs = list(props.items())
    elif isinstance(props, list) and all(isinstance(p, tuple) and len(p) == 2 for p in props):
        pairs = list(props)
    else:
        return [], "properties must map strings to strings"
    if key is not None:
        pairs.append((KEY_PROPERTY, key))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs):
        return [], "properties and key must be strings"
    return pairs, None


def _row_error(topic: Any, payload: Any, qos: Any, retain: Any, max_packet: int) -> str | None:
    if not isinstance(topic, str) or not topic:
        return "no topic"
    try:
        validate_topic_name(topic)
    except TopicError as exc:
        return f"invalid topic: {exc}"
    if topic.startswith("$"):
        return "topics starting with '$' are reserved for the broker"
    if payload is None:
        return "no payload (an empty one clears a retained message: send b'')"
    if not isinstance(payload, bytes):
        return "payload must be binary or a string"
    size = len(payload) + len(topic.encode()) + PACKET_OVERHEAD
    if size > max_packet:
        return f"message of about {size} bytes exceeds the gateway's maximum packet size of {max_packet}"
    if qos is not None and (not isinstance(qos, int) or isinstance(qos, bool) or qos not in (0, 1, 2)):
        return f"qos must be 0, 1 or 2, not {qos!r}"
    if retain is not None and not isinstance(retain, bool):
        return f"retain must be true or false, not {retain!r}"
    return None


def _arrow_columns(body: bytes) -> dict[str, list]:
    try:
        import pyarrow as pa
    except ImportError:
        raise BadRequest("this gateway has no pyarrow (pip install 'tidemq[arrow]'): send JSON lines") from None
    try:
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise BadRequest(f"the body is not an Arrow IPC stream: {exc}") from None
    names = table.schema.names
    unknown = sorted(set(names) - set(COLUMNS))
    if unknown:
        raise BadRequest(f"unknown column(s) {', '.join(unknown)}; rows have {', '.join(COLUMNS)}")
    for required in ("topic", "payload"):
        if required not in names:
            raise BadRequest(f"rows need a {required} column")
    return {name: table.column(name).to_pylist() for name in names}


def _json_columns(body: bytes) -> dict[str, list]:
    columns: dict[str, list] = {name: [] for name in (*COLUMNS, "_error")}
    for line in body.splitlines():
        if not line.strip():
            continue
        error = None
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict):
            row, error = {}, "the line is not a JSON object"
        payload = row.get("payload")
        if "payload_base64" in row:
            try:
                payload = base64.b64decode(row["payload_base64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                error = "payload_base64 is not base64"
        columns["_error"].append(error)
        columns["topic"].append(row.get("topic"))
        columns["payload"].append(payload)
        columns["qos"].append(row.get("qos"))
        columns["retain"].append(row.get("retain"))
        columns["properties"].append(row.get("properties"))
        columns["key"].append(row.get("key"))
    return columns


def batch_key(query) -> str | None:
    """``{writer}/{batch}/{partition}/{chunk}`` from the query string (numbers zero-padded so
    a writer's keys sort by batch), or None: no idempotence asked for."""
    writer = query.get("writer")
    if writer is None:
        return None
    if not writer or len(writer) > 256 or "/" in writer or "\x00" in writer:
        raise AdminError(400, "writer must be 1-256 characters without '/'")
    if query.get("batch") is None:
        raise AdminError(400, "batch is required with writer")
    batch, partition, chunk = (_int(query.get(name, "0"), name) for name in ("batch", "partition", "chunk"))
    return f"{writer}/{batch:020d}/{partition:010d}/{chunk:010d}"


def _flag(query, name: str, default: bool) -> bool:
    raw = query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise AdminError(400, f"{name} must be true or false, not {raw!r}")


class PublishApi:
    """``POST /data/publish`` through the MQTT gateway's publish path (None: MQTT is off, 503)."""

    def __init__(self, mqtt: MQTTBroker | None, access: DataAccess, status: Status,
                 pressure: StorePressure | None) -> None:
        self.mqtt = mqtt
        self.access = access
        self.status = status
        self.pressure = pressure
        self.stats = PublishStats()
        self._decoding = asyncio.Semaphore(1)  # one decode at a time in the worker threads
        self._working = asyncio.Semaphore(MAX_CONCURRENT)
        self._keys: dict[str, _KeyLock] = {}  # batch keys being published now
        self._latest: dict[str, int] = {}  # writer -> highest batch seen (keys below it - 1 pruned)
        self._stored: dict[str, list[tuple[int, str]]] = {}  # writer -> (batch, key) stored by this process
        self._pruned_at = 0.0

    async def publish(self, request: web.Request) -> web.Response:
        broker, pressure = self.mqtt, self.pressure
        if broker is None:
            raise AdminError(503, "publishing needs the MQTT gateway (--mqtt-bind)")
        if not self.status.ready:
            raise AdminError(503, "the gateway is starting or stopping")
        if pressure is not None and pressure.raised:
            raise AdminError(503, f"publishers are blocked: {pressure.reason}")
        query = request.query
        key = batch_key(query)
        qos = _int(query.get("qos", "1"), "qos")
        if qos not in (0, 1, 2):
            raise AdminError(400, "qos must be 0, 1 or 2")
        retain = _flag(query, "retain", False)
        writer = query.get("writer")
        self.stats.requests += 1
        if key is None:
            return web.json_response(await self._publish(request, qos, retain, "data-api"))
        table = broker.store.table(KEYS_TABLE)
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _KeyLock()
        entry.users += 1
        try:
            async with entry.lock:  # a retry of a key still being published waits for that one
                done = await table.load(key)  # (a gateway node's table: read from the store node)
                if done is not None:
                    self.stats.duplicates += 1
                    answer = json.loads(done)
                    answer.pop("at", None)
                    return web.json_response({**answer, "duplicate": True, "key": key})
                answer = await self._publish(request, qos, retain, f"data-api:{writer}")
                try:
                    table.put(key, json.dumps({**answer, "at": time.time()}).encode())
                except StoreError as exc:  # stored, key not remembered: a retry stores again (at least once)
                    log.warning("data publish key not remembered key=%s error=%s", key, exc)
        finally:
            entry.users -= 1
            if not entry.users:
                del self._keys[key]
        try:
            self._prune(table, writer or "", int(query["batch"]), key)
        except StoreError:  # (a full disk) the keys are forgotten by a later batch or their age
            pass
        return web.json_response({**answer, "duplicate": False, "key": key})

    async def _publish(self, request: web.Request, qos: int, retain: bool, client_id: str) -> dict[str, Any]:
        broker = self.mqtt
        assert broker is not None
        async with self._working:
            body = await read_body(request)
            async with self._decoding:
                try:
                    decoded = await asyncio.to_thread(decode_rows, body, request.content_type, qos=qos,
                                                      retain=retain, max_packet=broker.settings.max_packet_size)
                except BadRequest as exc:
                    raise AdminError(400, str(exc)) from None
            del body
            publishes = decoded.publishes
            self.access.check_publish(request.get(PRINCIPAL), {p.topic for p in publishes})  # (data_access.py)
            try:
                puts = []
                for at in range(0, len(publishes), PUT_SLICE):  # the loop serves devices in between
                    puts.append(broker.publish(publishes[at:at + PUT_SLICE], client_id))
                    await asyncio.sleep(0)
                stored = sum(len(results) for results in await asyncio.gather(*puts))
            except StoreError as exc:
                log.error("data publish not stored rows=%d error=%s", len(publishes), exc)
                raise AdminError(503, f"not stored, retry: {exc}") from None
        self.stats.rows_stored += stored
        self.stats.rows_bad += decoded.bad_rows
        if decoded.bad_rows:
            log.info("data publish bad rows client_id=%s count=%d first=%s", client_id, decoded.bad_rows,
                     decoded.errors[0]["error"])
        return {"rows": decoded.rows, "stored": stored, "bad_rows": decoded.bad_rows, "errors": decoded.errors}

    def _prune(self, table: KeyValueTable, writer: str, batch: int, key: str) -> None:
        """Forget the keys Spark will not retry: a writer's batches below ``batch - 1`` (those
        this process stored, and those the table lists -- a gateway node's remote table lists
        none), and every key older than KEY_TTL_S (checked at most once per PRUNE_INTERVAL_S)."""
        stored = self._stored.setdefault(writer, [])
        stored.append((batch, key))
        if batch > self._latest.get(writer, -1):
            if len(self._latest) > 10_000:  # writers of one-off batch jobs: forget them (their keys age out)
                self._latest.clear()
                self._stored = {writer: stored}
            self._latest[writer] = batch
            if batch >= 2:
                cut = f"{writer}/{batch - 1:020d}"
                doomed = {k for b, k in stored if b < batch - 1}
                doomed.update(k for k, _ in _until(table.items(f"{writer}/"), cut))
                stored[:] = [(b, k) for b, k in stored if b >= batch - 1]
                for name in sorted(doomed):
                    table.delete(name)
        now = time.time()
        if now - self._pruned_at > PRUNE_INTERVAL_S:
            self._pruned_at = now
            old = []
            for name, raw in table.items():
                try:
                    at = float(json.loads(raw)["at"])
                except (ValueError, KeyError, TypeError):
                    at = 0.0
                if at < now - KEY_TTL_S:
                    old.append(name)
            for name in old:
                table.delete(name)

    def collector(self) -> PublishCollector:
        return PublishCollector(self.stats)


def _until(items: Iterator[tuple[str, bytes]], cut: str) -> Iterator[tuple[str, bytes]]:
    for name, raw in items:
        if name >= cut:
            return
        yield name, raw


def _int(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise AdminError(400, f"{name} must be a number, not {raw!r}") from None
    if not 0 <= value < 10**18:
        raise AdminError(400, f"{name} must be 0 or more")
    return value


async def read_body(request: web.Request, max_bytes: int = MAX_BODY_BYTES) -> bytes:
    """The whole body, up to ``max_bytes`` (read from the stream: the application's
    client_max_size of 1 MiB is for the admin API's small JSON bodies); AdminError 413 past it."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise AdminError(413, f"at most {max_bytes} bytes per request: send smaller chunks")
    parts = []
    size = 0
    while True:
        part = await request.content.readany()
        if not part:
            break
        size += len(part)
        if size > max_bytes:
            raise AdminError(413, f"at most {max_bytes} bytes per request: send smaller chunks")
        parts.append(part)
    return b"".join(parts)


class PublishCollector:
    """``tidemq_data_publish_*``: what ``POST /data/publish`` stored, refused and answered twice."""

    def __init__(self, stats: PublishStats) -> None:
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield CounterMetricFamily("tidemq_data_publish_requests", "POST /data/publish requests", value=s.requests)
        rows = CounterMetricFamily("tidemq_data_publish_rows", "Rows of POST /data/publish by outcome",
                                   labels=["result"])
        rows.add_metric(["stored"], s.rows_stored)
        rows.add_metric(["bad"], s.rows_bad)
        yield rows
        yield CounterMetricFamily("tidemq_data_publish_duplicates",
                                  "POST /data/publish requests whose batch key was already stored (answered, "
                                  "not stored again)", value=s.duplicates)
