"""The two ways the Spark source reaches the store, behind one small interface (``StoreClient``):

- ``HttpClient``: a running gateway's read API (``gateway/http/data_api.py``) over HTTP, standard
  library only, one keep-alive connection. Works from any host; the gateway sees everything it
  has indexed, so offsets are current. A gateway that is away (a restart) is tried again with
  backoff for ``retryTimeoutMs``.
- ``DirectClient``: the data directory on this host through ``store.read.readonly.StoreReader`` (a
  RocksDB secondary and read-only commitlog maps). No network hop and no load on the gateway,
  but only for co-located executors, and it sees what the gateway's index has flushed (up to
  ``index_flush_interval_s`` behind): offsets it offers are what it can read.

Both answer a read with the same ``Fetch`` and build rows with the same code
(``store.read.columns``). Spark reuses its Python workers across tasks, so ``client_for`` keeps one
client per connection per process (opening a secondary costs a few ms and a file per SST).
The sink (``spark_sinks/writer.py``) publishes through a subclass of ``HttpClient``.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self

import pyarrow as pa

from protocols.queue_names import matching_topic_queues, topic_of_queue

from .spark_options import DEFAULT_RETRY_TIMEOUT_S, Connection

if TYPE_CHECKING:
    from store.read.readonly import StoreReader

log = logging.getLogger("tidemq.spark")

TIMEOUT_S = 60.0
RETRY_BACKOFF_S = (0.25, 5.0)  # first and longest wait between attempts (doubling)
RETRY_STATUSES = frozenset({502, 503, 504})
RANGES_PER_READ = 10_000  # the most ranges a gateway serves in one POST /data/read  # the gateway (or a proxy in front) is starting or stopping


@dataclass(frozen=True, slots=True)
class Retries:
    """When ``HttpClient.exchange`` tries a request again: after a connection error or an answer
    of one of ``statuses``, waiting ``first_s``, then ``factor`` times longer up to ``longest_s``,
    until ``attempts`` were made or ``timeout_s`` has passed (None: no such bound). ``at_once``:
    the first retry goes without waiting."""

    statuses: Container[int]
    first_s: float
    factor: float
    longest_s: float
    attempts: int | None = None
    timeout_s: float | None = None
    at_once: bool = False


class GaveUp(Exception):
    """``HttpClient.exchange`` spent its retries; ``problem`` says what the last attempt met."""

    def __init__(self, problem: str, attempts: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.attempts = attempts


class SourceError(RuntimeError):
    """The store could not be read (unreachable gateway, refused token, bad request)."""


@dataclass(slots=True)
class Fetch:
    """Rows of [first_offset, next_offset) and the queue's (min, max) offsets when read.
    ``first_offset`` past the offset asked for: the messages in between are gone."""

    first_offset: int
    next_offset: int
    min_offset: int
    max_offset: int
    batches: list[pa.RecordBatch] = field(default_factory=list)
    exists: bool = True


def split_rows(counts: list[int], batches: Iterable[pa.RecordBatch], into: list[Fetch]) -> list[Fetch]:
    """Batches of the rows of several ranges, in order (``counts[i]`` rows for the i-th), as
    each range's own batches (zero-copy slices) on ``into[i]``; returns ``into``."""
    pending = iter(batches)
    batch: pa.RecordBatch | None = None
    at = 0
    for count, fetch in zip(counts, into):
        while count:
            if batch is None or at == batch.num_rows:
                batch, at = next(pending), 0
                continue
            take = min(count, batch.num_rows - at)
            fetch.batches.append(batch if take == batch.num_rows else batch.slice(at, take))
            at += take
            count -= take
    return into


@dataclass(slots=True)
class TopicListing:
    """Topic queues the filters match, with (first readable, next) offsets: all of them
    (``complete``), or those that changed since the listing whose ``cursor`` was asked with.
    ``cursor`` (None: the client offers none) is what to ask the next listing with."""

    queues: dict[str, tuple[int, int]]
    cursor: str | None = None
    complete: bool = True


class StoreClient(Protocol):
    def topic_queues(self, topic_filters: list[str]) -> dict[str, tuple[int, int]]: ...
    def topic_listing(self, topic_filters: list[str], since: str | None = None) -> TopicListing: ...
    def hold_reading(self, topic_filters: tuple[str, ...], lease_s: float) -> bool: ...
    def offsets(self, queues: list[str]) -> dict[str, tuple[int, int] | None]: ...
    def offsets_for_times(self, times: dict[str, int]) -> dict[str, int | None]: ...
    def read(self, queue: str, start: int, end: int, max_rows: int,
             columns: tuple[str, ...] | None = None) -> Fetch: ...
    def read_many(self, ranges: list[tuple[str, int, int]], max_rows: int,
                  columns: tuple[str, ...] | None = None) -> list[Fetch]: ...
    def close(self) -> None: ...


class HttpClient:
    """One keep-alive connection to a gateway's data API. A gateway that cannot be reached (or
    answers 502-504) is tried again with backoff for ``retry_timeout_s``, each retry logged, as a
    Kafka consumer keeps trying its broker: a gateway restart must not end a streaming query."""

    def __init__(self, url: str, token: str | None = None, username: str | None = None,
                 password: str | None = None, retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SourceError(f"tidemq source: address must be HOST:PORT or http(s)://HOST:PORT, not {url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._base = parts.path.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if username is not None:  # a user of the gateway's password file (its ACL applies)
            basic = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers = {"Authorization": f"Basic {basic}"}
        self._conn: http.client.HTTPConnection | None = None
        self.url = url
        self.retry_timeout_s = retry_timeout_s

    @classmethod
    def of(cls, connection: Connection) -> Self:
        """A client with ``connection``'s address, credentials and retry timeout (the one place
        a Connection is turned into a client: positional arguments went astray before)."""
        return cls(connection.url, token=connection.token, username=connection.username,
                   password=connection.password, retry_timeout_s=connection.retry_timeout_s)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=TIMEOUT_S)
        return self._conn

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, http.client.HTTPResponse, bytes]:
        headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            retries = Retries(RETRY_STATUSES, RETRY_BACKOFF_S[0], 2, RETRY_BACKOFF_S[1],
                              timeout_s=self.retry_timeout_s, at_once=True)
            return self.exchange(method, path, payload, headers, retries, "source")
        except GaveUp as exc:
            raise SourceError(f"tidemq source: {exc.problem} (gave up after {exc.attempts} attempts in "
                              f"{self.retry_timeout_s:g} s; option retryTimeoutMs)") from None

    def exchange(self, method: str, path: str, payload: bytes | None, headers: dict[str, str], retries: Retries,
                 who: str) -> tuple[int, http.client.HTTPResponse, bytes]:
        """``method path`` (below the client's base path) on the kept-alive connection, tried
        again as ``retries`` says, each retry logged for ``who``; the first answer of a status
        not to retry, or ``GaveUp``."""
        deadline = None if retries.timeout_s is None else time.monotonic() + retries.timeout_s
        delay, attempt = retries.first_s, 0
        while True:
            attempt += 1
            conn = self._connection()
            try:
                conn.request(method, self._base + path, payload, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._conn = None
                problem = f"cannot reach the gateway at {self.url}: {exc}"
            else:
                if response.status not in retries.statuses:
                    return response.status, response, data
                problem = f"{self.url}{path.split('?')[0]} answered {response.status}: {error_text(data)}"
            if attempt == 1 and retries.at_once:
                continue  # a kept-alive connection the gateway closed while idle: once more, afresh, at once
            if retries.attempts is not None and attempt >= retries.attempts:
                raise GaveUp(problem, attempt)
            wait = delay
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GaveUp(problem, attempt)
                wait = min(delay, left)
            log.warning("tidemq %s: gateway not answering, retrying attempt=%d in_s=%.2f error=%s",
                        who, attempt, wait, problem)
            time.sleep(wait)
            delay = min(delay * retries.factor, retries.longest_s)

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        status, _, data = self._request(method, path, body)
        if status != 200:
            raise SourceError(f"tidemq source: {self.url}{path.split('?')[0]} answered {status}: {error_text(data)}")
        return json.loads(data)

    def topic_queues(self, topic_filters: list[str]) -> dict[str, tuple[int, int]]:
        """(first readable, next) offset of each topic queue the filters match and the
        connection's user may read (``gateway/http/data_topics.py``)."""
        return self.topic_listing(topic_filters).queues

    def topic_listing(self, topic_filters: list[str], since: str | None = None) -> TopicListing:
        """``topic_queues``, or with ``since`` (an earlier listing's cursor) those that got
        messages since then, unless the gateway answers with all (``complete``)."""
        body: dict[str, Any] = {"topicFilters": topic_filters}
        if since is not None:
            body["since"] = since
        answer = self._json("POST", "/data/topics", body)
        return TopicListing({row["queue"]: (row["min_offset"], row["max_offset"]) for row in answer["queues"]},
                            answer.get("cursor"), answer.get("complete", True))

    def hold_reading(self, topic_filters: tuple[str, ...], lease_s: float) -> bool:
        """Tell the gateway the filters' topic queues are read, for ``lease_s`` (a reader-only
        hold: ``gateway/http/data_holds.py``), so that it does not remove them while idle."""
        for topic_filter in topic_filters:
            self._json("POST", "/data/filters", {"topicFilter": topic_filter, "lease_ms": int(lease_s * 1000),
                                                 "index": False})
        return True

    def offsets(self, queues: list[str]) -> dict[str, tuple[int, int] | None]:
        answer = self._json("POST", "/data/offsets", {"queues": queues})["offsets"]
        return {q: (o["min_offset"], o["max_offset"]) if o else None for q, o in answer.items()}

    def offsets_for_times(self, times: dict[str, int]) -> dict[str, int | None]:
        """Per queue, the first offset stored at or after its time (ms), None if none is."""
        return self._json("POST", "/data/times", {"queues": times})["offsets"]

    def read(self, queue: str, start: int, end: int, max_rows: int,
             columns: tuple[str, ...] | None = None) -> Fetch:
        """Rows of [start, end), at most ``max_rows``, with ``columns`` only (None: all)."""
        params: dict[str, Any] = {"queue": queue, "start": start, "end": end, "max_rows": max_rows}
        if columns is not None:
            params["columns"] = ",".join(columns)
        query = urllib.parse.urlencode(params)
        status, response, data = self._request("GET", "/data/read?" + query)
        if status == 404:
            return Fetch(start, start, 0, 0, exists=False)
        if status != 200:
            raise SourceError(f"tidemq source: reading {queue!r} from {self.url} failed with {status}: {error_text(data)}")
        def header(name: str) -> str:
            value = response.getheader(name)
            assert value is not None, f"the gateway's answer has no {name}"  # (it sends all four)
            return value

        batches = list(pa.ipc.open_stream(pa.py_buffer(data))) if data else []
        return Fetch(int(header("TideMQ-First-Offset")), int(header("TideMQ-Next-Offset")),
                     int(header("TideMQ-Min-Offset")), int(header("TideMQ-Max-Offset")), batches)

    def read_many(self, ranges: list[tuple[str, int, int]], max_rows: int,
                  columns: tuple[str, ...] | None = None) -> list[Fetch]:
        """Several ranges (queue, start, end) in one request, up to ``max_rows`` rows in all: a
        Fetch for each range served, in order (a prefix of ``ranges``: ask again for the rest)."""
        body: dict[str, Any] = {"ranges": [list(r) for r in ranges], "max_rows": max_rows, "joined": True}
        if columns is not None:
            body["columns"] = list(columns)
        status, _, data = self._request("POST", "/data/read", body)
        if status == 405:  # a gateway from before POST /data/read: the first range alone
            return [self.read(*ranges[0], max_rows, columns)]
        if status != 200:
            raise SourceError(f"tidemq source: reading {len(ranges)} ranges from {self.url} failed with {status}: "
                              f"{error_text(data)}")
        size = int.from_bytes(data[:4], "big")
        served = json.loads(data[4:4 + size])["ranges"]
        out: list[Fetch] = []
        counts: list[int] = []
        for (queue, start, _), meta in zip(ranges, served):
            if meta is None:
                out.append(Fetch(start, start, 0, 0, exists=False))
                counts.append(0)
                continue
            out.append(Fetch(meta["first"], meta["next"], meta["min"], meta["max"]))
            counts.append(meta["rows"])
        return split_rows(counts, pa.ipc.open_stream(pa.py_buffer(memoryview(data)[4 + size:])), out)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class DirectClient:
    """Reads the data directory (``dataDir``). The store's code is imported here, when one is
    made: a process reading through the gateway (``HttpClient``) loads none of it."""

    def __init__(self, data_dir: str) -> None:
        from store.read.readonly import StoreReader

        if not os.path.isdir(os.path.join(data_dir, "index")):
            raise SourceError(f"tidemq source: {data_dir} is not a TideMQ data directory on this host "
                              "(dataDir is for co-located executors; use address otherwise)")
        self.reader = StoreReader(data_dir)

    def topic_queues(self, topic_filters: list[str]) -> dict[str, tuple[int, int]]:
        """As the gateway's listing, from the names the index has flushed (no ACL: whoever
        reads the files reads everything)."""
        self.reader.refresh()
        names = matching_topic_queues(topic_filters, self.reader.index.iter_names)
        found = {name: self.reader.offsets(name) for name in names}
        return {name: offsets for name, offsets in found.items() if offsets is not None}

    def topic_listing(self, topic_filters: list[str], since: str | None = None) -> TopicListing:
        """Always every queue (the files keep no record of what changed)."""
        return TopicListing(self.topic_queues(topic_filters))

    def offsets(self, queues: list[str]) -> dict[str, tuple[int, int] | None]:
        self.reader.refresh()
        return {q: self.reader.offsets(q) for q in queues}

    def hold_reading(self, topic_filters: tuple[str, ...], lease_s: float) -> bool:
        return False  # (no gateway to tell: a dataDir stream is no reader of idle queues)

    def offsets_for_times(self, times: dict[str, int]) -> dict[str, int | None]:
        from store.read.readonly import first_readable_offset

        self.reader.refresh()
        reader = self.reader
        out: dict[str, int | None] = {}
        for queue, at in times.items():
            state = reader.queue(queue)
            if state is None:
                out[queue] = None
                continue
            low = first_readable_offset(reader.index, state, reader.commitlog.min_position)
            out[queue] = reader.index.offset_for_time(state.qid, low, state.next_offset, at)
        return out

    def read(self, queue: str, start: int, end: int, max_rows: int,
             columns: tuple[str, ...] | None = None) -> Fetch:
        return self.read_many([(queue, start, end)], max_rows, columns)[0]

    def read_many(self, ranges: list[tuple[str, int, int]], max_rows: int,
                  columns: tuple[str, ...] | None = None) -> list[Fetch]:
        """As ``HttpClient.read_many``, from the files: the ranges' records read together
        (``store.read.columns.read_ranges``), as the gateway does."""
        from store.read import columns as store_columns
        from store.read.readonly import first_readable_offset

        reader = self.reader
        if any((state := reader.queue(q)) is None or state.next_offset < end for q, _, end in ranges):
            reader.refresh()  # planned from a newer view: catch up
        floor = reader.commitlog.min_position
        out: list[Fetch] = []
        reads: list[Fetch] = []  # those with rows to read, as ``wanted`` lists them
        wanted: list[tuple[str, int, int, int, str | None]] = []
        for queue, start, end in ranges:
            if max_rows <= 0:
                break
            state = reader.queue(queue)
            if state is None:
                out.append(Fetch(start, start, 0, 0, exists=False))
                continue
            low = first_readable_offset(reader.index, state, floor)
            first, stop = store_columns.clamp(start, end, low, state.next_offset, max_rows)
            out.append(Fetch(first, first, low, state.next_offset))
            if first < stop:
                reads.append(out[-1])
                wanted.append((queue, state.qid, first, stop, topic_of_queue(queue)))
                max_rows -= stop - first
        found, batches = store_columns.read_ranges(reader.index.db, reader.commitlog, wanted, floor,
                                                   store_columns.schema_of(columns))
        for fetch, read in zip(reads, found):
            fetch.first_offset, fetch.next_offset = read.first_offset, read.next_offset
        split_rows([read.rows for read in found], batches, reads)
        return out

    def close(self) -> None:
        self.reader.close()


class ReadingLease:
    """A streaming query's reader-only hold on its topic filters (``HttpClient.hold_reading``),
    renewed every third of the lease by a thread of its own (with a client of its own: trigger
    intervals may be longer than the lease); it lapses a lease after the query stops. A query
    reading the store's directory (dataDir) has no gateway to tell: nothing is held."""

    def __init__(self, connection: Connection, topic_filters: tuple[str, ...], lease_s: float) -> None:
        self.connection, self.topic_filters, self.lease_s = connection, topic_filters, lease_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None or not self.topic_filters:
            return
        # a refusal (bad token) fails the query; a dataDir client has no gateway to tell
        if not client_for(self.connection).hold_reading(self.topic_filters, self.lease_s):
            return
        self._thread = threading.Thread(target=self._renew, name="tidemq-reading-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        client = HttpClient.of(self.connection)
        try:
            while not self._stop.wait(self.lease_s / 3):
                try:
                    client.hold_reading(self.topic_filters, self.lease_s)
                except SourceError as exc:
                    log.error("tidemq source: cannot renew the reading hold on %s: %s", self.topic_filters, exc)
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()

    def __getstate__(self) -> dict:  # (the reader travels to the executors: never its thread)
        return {"connection": self.connection, "topic_filters": self.topic_filters, "lease_s": self.lease_s}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["connection"], state["topic_filters"], state["lease_s"])


_CLIENTS: dict[Connection, StoreClient] = {}


def client_for(connection: Connection) -> StoreClient:
    """This process's client for ``connection`` (made on first use)."""
    client = _CLIENTS.get(connection)
    if client is None:
        if connection.data_dir is not None:
            client = DirectClient(connection.data_dir)
        else:
            client = HttpClient.of(connection)
        _CLIENTS[connection] = client
    return client


def close_clients() -> None:
    while _CLIENTS:
        _, client = _CLIENTS.popitem()
        client.close()


def error_text(data: bytes) -> str:
    """The ``error`` of a gateway's JSON answer, or the start of the body."""
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode(errors="replace")
