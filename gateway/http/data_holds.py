"""Wildcard filters held by data-API readers of a wildcard queue ``w:{filter}``, so that the queue
gets every matching publish from the moment a reader starts, whether or not an MQTT client
subscribes to it. (The Spark source's ``topicFilter`` reads the filter's topic queues instead,
``data_topics.py``, and holds them as a reader only: ``"index": false``.)

    POST /data/filters  {"topicFilter": "a/+/b", "lease_ms": 600000}  hold (or renew) a filter
    POST /data/filters  {"topicFilter": "a/+/b", "lease_ms": 600000, "index": false}  read it

A hold is one more reference in the MQTT wildcard filters (``gateway/mqtt/queues.py``
``WildcardQueues``), as a subscription is, and lasts ``lease_ms``: the reader renews it while it
runs, and a reader that stops (or dies) lets it lapse, so an abandoned filter does not cost write
amplification for ever. Several readers of one filter share one hold that lasts to the latest of
their leases. Holds are stored (table ``data_filter_holds``: filter -> expiry, Unix seconds) and
restored when the gateway starts, so a gateway restart does not open a gap in the queue.

A hold also makes the topic queues its filter matches *read* (``reads``): idle light queues are
removed only when nobody reads them (store/retention/reclaim.py). A reader-only hold (``"index": false``,
a running Spark stream's) does only that: no wildcard queue, not stored (a restarted gateway
hears from the stream again within a third of its lease). A concrete filter's hold is kept for
that alone as well (its topic queue gets every publish anyway).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from protocols.mqtt.topics import is_wildcard, matches, validate_topic_filter

from ..interop import TOPIC_QUEUE_PREFIX, queue_for_filter
from .errors import AdminError, no_store

if TYPE_CHECKING:
    from store import MessageStore

    from ..mqtt.queues import WildcardQueues

log = logging.getLogger("tidemq.data")

HOLDS_TABLE = "data_filter_holds"
MIN_LEASE_MS = 100
MAX_LEASE_MS = 7 * 24 * 3600 * 1000


class FilterHolds:
    """The holds, over the store (None: a gateway node's, 501) and the wildcard filters MQTT
    publishes are indexed by: the MQTT broker's, or a store node's cluster-wide ones (None:
    MQTT is off, 501)."""

    def __init__(self, store: MessageStore | None, wildcards: WildcardQueues | None) -> None:
        self.store = store
        self.wildcards = wildcards
        self._expiry: dict[str, float] = {}  # filter -> when its hold lapses (time.time())
        self._readers: dict[str, float] = {}  # reader-only holds ("index": false): filter -> lapse (not stored)
        self._timer: asyncio.TimerHandle | None = None
        self._restore()

    def _restore(self) -> None:
        store, wildcards = self.store, self.wildcards
        if store is None or wildcards is None:
            return
        table, now = store.table(HOLDS_TABLE), time.time()
        for topic_filter, raw in list(table.items()):
            try:
                expires = float(raw)
            except ValueError:
                expires = 0.0
            if expires <= now:
                table.delete(topic_filter)
                continue
            if is_wildcard(topic_filter):
                wildcards.add(topic_filter)
            self._expiry[topic_filter] = expires
        if self._expiry:
            log.info("data filter holds restored count=%d", len(self._expiry))
            self._schedule()

    async def hold(self, request: web.Request, may_read: Callable[[str], None] | None = None) -> web.Response:
        """``may_read`` raises AdminError when the caller may not read the queue of the filter."""
        try:
            body = await request.json()
            topic_filter, lease_ms = body["topicFilter"], body.get("lease_ms", 600_000)
            index = body.get("index", True)
            if not isinstance(topic_filter, str) or not isinstance(lease_ms, int) or isinstance(lease_ms, bool) \
                    or not isinstance(index, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            raise AdminError(400, 'send {"topicFilter": "a/+/b", "lease_ms": 600000, "index": true}') from None
        try:
            validate_topic_filter(topic_filter)
        except ValueError as exc:
            raise AdminError(400, f"bad topicFilter: {exc}") from None
        if not MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS:
            raise AdminError(400, f"lease_ms must be {MIN_LEASE_MS}..{MAX_LEASE_MS}, not {lease_ms}")
        queue = queue_for_filter(topic_filter)
        if may_read is not None:
            may_read(queue)
        if not index:  # a reader of the filter's topic queues (a Spark stream), no wildcard queue
            self._readers[topic_filter] = max(self._readers.get(topic_filter, 0.0), time.time() + lease_ms / 1000)
            self._schedule()
            return web.json_response({"topicFilter": topic_filter, "queue": queue, "held": False, "reader": True})
        wildcard = is_wildcard(topic_filter)  # (a topic queue gets every publish to its topic anyway)
        store, wildcards = self.store, self.wildcards
        if not wildcard and (store is None or wildcards is None):  # (nothing would ever remove its queue here)
            return web.json_response({"topicFilter": topic_filter, "queue": queue, "held": False})
        if store is None:
            raise no_store()
        if wildcards is None:
            raise AdminError(501, "this gateway has no MQTT wildcard queues (MQTT is off)")
        expires = time.time() + lease_ms / 1000
        if topic_filter not in self._expiry:
            if wildcard:
                wildcards.add(topic_filter)
            log.info("data filter held topic_filter=%s lease_ms=%d", topic_filter, lease_ms)
        elif self._expiry[topic_filter] >= expires:
            return web.json_response({"topicFilter": topic_filter, "queue": queue, "held": wildcard})
        self._expiry[topic_filter] = expires
        store.table(HOLDS_TABLE).put(topic_filter, repr(expires).encode())
        self._schedule()
        return web.json_response({"topicFilter": topic_filter, "queue": queue, "held": wildcard})

    def reads(self, queue: str) -> bool:
        """Whether a held filter matches the topic of this topic queue (a reader: store/retention/reclaim.py)."""
        if not (self._expiry or self._readers) or not queue.startswith(TOPIC_QUEUE_PREFIX):
            return False
        topic = queue[len(TOPIC_QUEUE_PREFIX):]
        return any(matches(topic_filter, topic) for held in (self._expiry, self._readers) for topic_filter in held)

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._expiry or self._readers:
            delay = max(0.0, min(*self._expiry.values(), *self._readers.values(), float("inf")) - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay + 0.01, self._lapse)

    def _lapse(self) -> None:
        self._timer = None
        store, wildcards, now = self.store, self.wildcards, time.time()
        for topic_filter, expires in list(self._expiry.items()):
            if expires <= now:
                del self._expiry[topic_filter]
                if wildcards is not None and is_wildcard(topic_filter):
                    wildcards.remove(topic_filter)
                if store is not None:
                    store.table(HOLDS_TABLE).delete(topic_filter)
                log.info("data filter hold lapsed topic_filter=%s", topic_filter)
        for topic_filter, expires in list(self._readers.items()):
            if expires <= now:
                del self._readers[topic_filter]
        self._schedule()

    async def close(self, app: web.Application | None = None) -> None:
        """The listener stops: no more timers (stored holds stay, for the next start)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
