"""The data read API: bulk reads of store queues as Apache Arrow, for the Spark source
(``spark_sinks``) and any other Arrow reader, under ``/data/`` on the metrics listener.

    GET  /data/queues?topicFilter=F | ?prefix=P[&limit=N][&after=C]  a filter's queue, or a page of queues by prefix
    GET  /data/offsets?queue=A&queue=B  (or POST {"queues": [...]})  first readable and next offset per queue
    POST /data/times  {"queues": {Q: T, ...}}  per queue, the first offset stored at or after T (ms), or null
    GET  /data/read?queue=Q&start=S[&end=E][&max_rows=N][&columns=C,D]  rows of offsets [S, E) as an Arrow IPC stream
    POST /data/read  {"ranges": [[Q, S, E], ...], "max_rows": N, "columns": [C, ...]}  several ranges in one answer
    POST /data/publish?writer=W&batch=B&partition=P&chunk=C  rows published as MQTT messages (gateway/http/data_publish.py)
    POST /data/filters  {"topicFilter": F, "lease_ms": N}  hold F's wildcard queue for a reader (gateway/http/data_holds.py)
    POST /data/topics   {"topicFilters": [F, ...]}  the topic queues the filters match, with offsets (data_topics.py)

Why the metrics listener and not a port of its own: it is already the gateway's HTTP listener,
with ``admin_token`` (Bearer) guarding everything but the probes, and HTTP keeps clients simple
(any language, ``curl``); bulk reads are analytics, not device traffic, so they share the port
that operators already keep for tools. Enable it with ``--metrics-bind``.

A read answers with up to ``max_rows`` rows from ``max(start, first readable offset)``; its
headers say where it started and where to go on (``TideMQ-First-Offset``,
``TideMQ-Next-Offset``) and the queue's offsets (``TideMQ-Min-Offset``, ``TideMQ-Max-Offset``).
A first offset past ``start`` means retention removed the messages in between: the reader
decides whether that is an error (Spark's ``failOnDataLoss``). Offsets offered (max offset) are
those already dispatched to the index, so everything offered is readable. ``columns`` (names of
``store.read.columns.ARROW_SCHEMA``, comma-separated) builds and ships only those columns: a reader
that needs topics and times does not pay for payloads and properties.

``POST /data/read`` reads several queue ranges in one request (a Spark task reading the few new
messages of each of many topics makes one request, not one a topic): the ranges in order, up to
``max_rows`` rows in all. The answer is a 4-byte big-endian length, that many bytes of JSON --
``{"ranges": [{"first", "next", "min", "max", "rows"} or null, ...]}``, one per range served (a
prefix of those asked: ask again for the rest), null for a queue not in the store -- then one
Arrow IPC stream of the served ranges' rows in order: with ``"joined": true`` a batch may hold
rows of several ranges (``rows`` says how many are each range's: they are built together),
without it no batch holds rows of two ranges (as clients from before ``joined`` read them).

The event loop only looks up the queue (the index's queue cache belongs to the loop thread);
the bulk part -- an index range scan, commitlog maps and Arrow building -- runs in a worker
thread (``asyncio.to_thread``), one read at a time (more would only contend for the GIL; the
others wait on the loop, not in the thread pool the store flushes from), in chunks of at most
``MAX_ROWS`` rows, so device traffic keeps getting the loop between chunks.
"""

from __future__ import annotations

import asyncio
import json
import threading
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from protocols.mqtt.topics import validate_topic_filter
from store import MessageStore

from ..interop import queue_for_filter, topic_of_queue
from .data_access import PRINCIPAL, DataAccess
from .data_topics import TopicListing
from .errors import AdminError, no_store
from .queue_pages import queue_page

if TYPE_CHECKING:
    from store.read.readonly import CommitLogReader

    from .data_holds import FilterHolds
    from .data_publish import PublishApi

ARROW_STREAM = "application/vnd.apache.arrow.stream"
DEFAULT_ROWS = 65_536
MAX_ROWS = 262_144
MAX_CONCURRENT_READS = 1  # one bulk read at a time: the gateway gives analytics at most ~1 core
MAX_QUEUES = 10_000  # per offsets or queues request
DEFAULT_QUEUES = 1000  # per page of /data/queues


def add_routes(app: web.Application, store: MessageStore | None, access: DataAccess, publish: PublishApi,
               holds: FilterHolds) -> None:
    api = DataApi(store, access)
    app.router.add_get("/data/queues", api.queues)
    app.router.add_get("/data/offsets", api.offsets)
    app.router.add_post("/data/offsets", api.offsets)
    app.router.add_post("/data/times", api.times)
    app.router.add_post("/data/topics", TopicListing(api._store, api._offsets, access).topics)  # a filter's history: data_topics.py
    app.router.add_get("/data/read", api.read)
    app.router.add_post("/data/read", api.read_many)
    app.router.add_post("/data/publish", publish.publish)  # the write side: gateway/http/data_publish.py
    # streaming readers of a topicFilter (gateway/http/data_holds.py): held by the gateway from its
    # start, before any listener, so a restart opens no gap in a held filter's queue
    async def hold(request: web.Request) -> web.Response:  # (only a filter the caller may read)
        return await holds.hold(request, partial(access.check_read_queue, request.get(PRINCIPAL)))

    app.router.add_post("/data/filters", hold)


def _limit(query, default: int, most: int) -> int:
    """A listing's ``limit``: 1 to ``most`` (more is refused, not cut silently)."""
    limit = _int(query, "limit", default)
    if not 1 <= limit <= most:
        raise AdminError(400, f"limit must be 1 to {most}: page on with after= (the answer's next_after)")
    return limit


def _int(query, name: str, default: int | None = None) -> int:
    raw = query.get(name)
    if raw is None:
        if default is None:
            raise AdminError(400, f"{name} is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise AdminError(400, f"{name} must be a number, not {raw!r}") from None
    if value < 0:
        raise AdminError(400, f"{name} must not be negative")
    return value


class DataApi:
    def __init__(self, store: MessageStore | None, access: DataAccess) -> None:
        self.store = store
        self.access = access
        self._reads = asyncio.Semaphore(MAX_CONCURRENT_READS)
        self._log: CommitLogReader | None = None
        self._log_lock = threading.Lock()  # belt and braces: the maps are not for two threads at once

    def _store(self) -> MessageStore:
        store = self.store
        if store is None:
            raise no_store()
        return store

    async def _offsets(self, queue: str) -> dict[str, int] | None:
        store = self._store()
        state = store.index.lookup(queue)
        if state is None:
            return None
        return {"min_offset": await store.min_offset(queue), "max_offset": state.next_offset}

    async def queues(self, request: web.Request) -> web.Response:
        """The queue an MQTT topic filter reads (its wildcard queue, which exists once a client has
        subscribed to the filter, or the topic queue of a plain topic), or a page of the queues
        whose name starts with a prefix (``next_after``: the ``after`` of the next page, null
        when the listing is complete). What a principal may not read, it is not shown either
        (data_access.py): left out before the page is cut, so ``limit`` counts readable queues."""
        store = self._store()
        who = request.get(PRINCIPAL)

        def readable(name: str) -> bool:
            return self.access.may_read_queue(who, name)

        topic_filter = request.query.get("topicFilter")
        next_after = None
        if topic_filter is not None:
            try:
                validate_topic_filter(topic_filter)
            except ValueError as exc:
                raise AdminError(400, f"bad topicFilter: {exc}") from None
            names = [name for name in [queue_for_filter(topic_filter)] if readable(name)]
        else:
            page = queue_page(store.index.iter_names, request.query.get("prefix", ""), request.query.get("after", ""),
                              _limit(request.query, DEFAULT_QUEUES, MAX_QUEUES), readable)
            names, next_after = page.names, page.next_after
        rows = []
        for name in names:
            offsets = await self._offsets(name)
            if offsets is not None:
                rows.append({"queue": name, **offsets})
        return web.json_response({"queues": rows, "next_after": next_after})

    async def offsets(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                names = (await request.json())["queues"]
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                raise AdminError(400, 'send {"queues": ["name", ...]}') from None
        else:
            names = request.query.getall("queue", [])
        if len(names) > MAX_QUEUES:
            raise AdminError(400, f"at most {MAX_QUEUES} queues per request")
        for name in names:
            self.access.check_read_queue(request.get(PRINCIPAL), name)
        out: dict[str, Any] = {name: await self._offsets(name) for name in names}
        return web.json_response({"offsets": out})

    async def times(self, request: web.Request) -> web.Response:
        """Kafka's offsetsForTimes: per queue, the first readable offset stored at or after the
        given time (ms since the epoch), null when every message is older or the queue does not
        exist (ConsumeQueueIndex.offset_for_time; a few index reads per queue, so on the loop)."""
        try:
            wanted = (await request.json())["queues"]
            if not isinstance(wanted, dict) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in wanted.values()):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise AdminError(400, 'send {"queues": {"name": time in ms since the epoch, ...}}') from None
        if len(wanted) > MAX_QUEUES:
            raise AdminError(400, f"at most {MAX_QUEUES} queues per request")
        store = self._store()
        out: dict[str, int | None] = {}
        for name, at in wanted.items():
            self.access.check_read_queue(request.get(PRINCIPAL), name)
            state = store.index.lookup(name)
            out[name] = None if state is None else store.index.offset_for_time(
                state.qid, await store.min_offset(name), state.next_offset, at)
        return web.json_response({"offsets": out})

    async def read(self, request: web.Request) -> web.StreamResponse:
        try:
            from store.read import columns
            from store.read.readonly import CommitLogReader
        except ImportError as exc:
            raise AdminError(501, f"the read API needs numpy and pyarrow (pip install 'tidemq[arrow]'): {exc}") from None
        store = self._store()
        query = request.query
        queue = query.get("queue")
        if not queue:
            raise AdminError(400, "queue is required")
        self.access.check_read_queue(request.get(PRINCIPAL), queue)
        start = _int(query, "start")
        try:
            schema = columns.schema_of(query["columns"].split(",") if "columns" in query else None)
        except ValueError as exc:
            raise AdminError(400, f"bad columns: {exc}") from None
        max_rows = min(_int(query, "max_rows", DEFAULT_ROWS), MAX_ROWS)
        state = store.index.lookup(queue)
        if state is None:
            raise AdminError(404, f"no queue {queue!r} in the store")
        low = await store.min_offset(queue)
        high = state.next_offset
        first, stop = columns.clamp(start, _int(query, "end", high), low, high, max_rows)
        if self._log is None:
            self._log = CommitLogReader(store.commitlog.directory)
        if first < stop:
            async with self._reads:
                result, body = await asyncio.to_thread(self._read, store, queue, state.qid, first, stop, schema)
        else:  # nothing to read: before the first readable offset, or at (or past) the end
            result, body = columns.RangeRead(first, first), columns.arrow_stream([], schema)
        headers = {
            "TideMQ-First-Offset": str(result.first_offset), "TideMQ-Next-Offset": str(result.next_offset),
            "TideMQ-Min-Offset": str(low), "TideMQ-Max-Offset": str(high),
        }
        return web.Response(body=memoryview(body), content_type=ARROW_STREAM, headers=headers)

    async def read_many(self, request: web.Request) -> web.Response:
        """Several queue ranges in one answer (the module's docstring says its form)."""
        try:
            from store.read import columns
            from store.read.readonly import CommitLogReader
        except ImportError as exc:
            raise AdminError(501, f"the read API needs numpy and pyarrow (pip install 'tidemq[arrow]'): {exc}") from None
        store = self._store()
        try:
            body = await request.json()
            ranges = [(str(q), int(s), int(e)) for q, s, e in body["ranges"]]
            names = body.get("columns")
            if not all(isinstance(r[0], str) and r[1] >= 0 and r[2] >= 0 for r in body["ranges"]):
                raise TypeError
            max_rows = min(int(body.get("max_rows", DEFAULT_ROWS)), MAX_ROWS)
        except (ValueError, KeyError, TypeError):
            raise AdminError(400, 'send {"ranges": [["queue", start, end], ...], "max_rows": N, '
                                  '"columns": ["name", ...]}') from None
        if not 1 <= len(ranges) <= MAX_QUEUES:
            raise AdminError(400, f"1 to {MAX_QUEUES} ranges per request")
        try:
            schema = columns.schema_of(names)
        except ValueError as exc:
            raise AdminError(400, f"bad columns: {exc}") from None
        for queue, _, _ in ranges:
            self.access.check_read_queue(request.get(PRINCIPAL), queue)
        if self._log is None:
            self._log = CommitLogReader(store.commitlog.directory)
        planned: list[tuple[str, int, int, int, int, int] | None] = []  # (queue, qid, first, stop, low, high)
        left = max_rows
        for queue, start, end in ranges:  # on the loop: the index's queue cache is the loop's
            if left <= 0:
                break
            state = store.index.lookup(queue)
            if state is None:
                planned.append(None)
                continue
            low, high = await store.min_offset(queue), state.next_offset
            first, stop = columns.clamp(start, end, low, high, left)
            planned.append((queue, state.qid, first, stop, low, high))
            left -= stop - first
        async with self._reads:
            results, batches = await asyncio.to_thread(self._read_ranges, store, planned, schema,
                                                       body.get("joined") is True)
        served: list[dict[str, int] | None] = []
        for plan, result in zip(planned, results):
            if plan is None or result is None:
                served.append(None)
                continue
            served.append({"first": result.first_offset, "next": result.next_offset, "min": plan[4], "max": plan[5],
                           "rows": result.rows})
        meta = json.dumps({"ranges": served}).encode()
        stream = columns.arrow_stream(batches, schema)
        return web.Response(body=len(meta).to_bytes(4, "big") + meta + memoryview(stream),
                            content_type="application/octet-stream")

    def _read_ranges(self, store, planned: list, schema, joined: bool) -> tuple[list, list]:
        """The planned ranges' reads, together (``columns.read_ranges_live``: their rows in
        batches that may hold several ranges' rows) or, not ``joined``, each range apart (a
        client from before joined batches reads a batch a range), in a worker thread; empty
        ones without touching the store."""
        from store.read import columns

        wanted = [(q, qid, first, stop, topic_of_queue(q))
                  for q, qid, first, stop, _, _ in (p for p in planned if p is not None and p[2] < p[3])]
        assert self._log is not None
        with self._log_lock:
            if joined:
                reads, batches = columns.read_ranges_live(store.index.db, self._log, store.commitlog, wanted, schema)
            else:
                reads, batches = [], []
                for one in wanted:
                    read, its = columns.read_ranges_live(store.index.db, self._log, store.commitlog, [one], schema)
                    reads.extend(read)
                    batches.extend(its)
        found = iter(reads)
        results: list[Any] = []
        for plan in planned:
            if plan is None:
                results.append(None)
            else:
                results.append(next(found) if plan[2] < plan[3] else columns.RangeRead(plan[2], plan[2]))
        return results, batches

    def _read(self, store, queue: str, qid: int, first: int, stop: int, schema):
        from store.read import columns

        assert self._log is not None
        with self._log_lock:
            # a topic queue's rows all have its topic (the store knows no queue names)
            result = columns.read_range_live(store.index.db, self._log, store.commitlog, queue, qid, first, stop, schema,
                                             topic_of_queue(queue))
        return result, columns.arrow_stream(result.batches, schema)
