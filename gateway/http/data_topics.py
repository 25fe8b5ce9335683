"""The topic queues behind MQTT topic filters, with their offsets, for readers of a filter's
whole history (the Spark source's ``topicFilter``): one queue per concrete topic, listed from the
store's queue names, those the principal may not read left out.

    POST /data/topics  {"topicFilters": ["a/+/b", "c/#"]}
      -> {"queues": [{"queue": "t:a/x/b", "min_offset": 0, "max_offset": 42}, ...], "cursor": C, "complete": true}
    POST /data/topics  {"topicFilters": [...], "since": C}
      -> {"queues": [the matching topic queues that changed since C], "cursor": C2, "complete": false}

``since`` (the ``cursor`` of an earlier answer) lists only the matching topic queues that got
messages since then (``topic_changes.py``): a streaming reader's listing each trigger costs
what changed. A cursor the gateway does not know (it restarted) gets the full listing,
``complete`` true. A reader still lists everything now and then: first offsets move with
retention and removed queues leave no change behind.

Every MQTT publish is indexed into its topic's queue whoever subscribes, so these queues hold
everything stored that matches, from retention's start; a reader reads them with offsets per
queue (read amplification) and needs no wildcard queue (no write amplification). A held filter's
topics (the presence events', ``protocols.queue_names.HELD_FILTERS``) are the exception: the
filter's queue is listed for them, last (its rows of other topics are the reader's to drop). Listing scans
the queue names under each filter's literal prefix (``protocols.queue_names``) in a worker
thread, matching and the principal's read check included, then looks the matches' offsets up
on the loop (the index's queue cache is the loop's), giving the loop back every ``YIELD_EVERY``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from protocols.mqtt.topics import validate_topic_filter
from protocols.queue_names import held_queues, matching_topic_queues

from .data_access import PRINCIPAL, DataAccess
from .errors import AdminError
from .topic_changes import TopicChanges

if TYPE_CHECKING:
    from store import MessageStore

MAX_FILTERS = 100
MAX_TOPIC_QUEUES = 250_000  # per answer (~80 bytes of JSON each): a wider listing asks for narrower filters
YIELD_EVERY = 1000


class TopicListing:
    """``POST /data/topics`` over the read API's store (``store()``: it or a 501), its offsets
of a queue (None: not in the store) and its access checks."""

    def __init__(self, store: Callable[[], MessageStore], offsets: Callable[[str], Awaitable[dict[str, int] | None]],
                 access: DataAccess) -> None:
        self.store, self.offsets, self.access = store, offsets, access
        self.changes = TopicChanges()

    async def topics(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            filters, since = body["topicFilters"], body.get("since")
            if not isinstance(filters, list) or not filters or not all(isinstance(f, str) for f in filters):
                raise TypeError
            if since is not None and not isinstance(since, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise AdminError(400, 'send {"topicFilters": ["a/+/b", ...]} (one filter at least), and "since": a '
                                  'cursor of an earlier answer if any') from None
        if len(filters) > MAX_FILTERS:
            raise AdminError(400, f"at most {MAX_FILTERS} topic filters per request")
        for topic_filter in filters:
            try:
                validate_topic_filter(topic_filter)
            except ValueError as exc:
                raise AdminError(400, f"bad topic filter {topic_filter!r}: {exc}") from None
        store = self.store()
        who, access = request.get(PRINCIPAL), self.access
        for held in held_queues(filters):  # (their topics are only in its queue: never a silent nothing)
            if not access.may_read_queue(who, held):
                raise AdminError(403, f"the filters overlap {held[2:]!r}: the messages of its topics (presence "
                                      f"events) are read from its queue {held!r}, and reading that needs read "
                                      "access to the whole filter")
        cursor = self.changes.cursor(store.listen_notify)  # (before listing: a change meanwhile comes again)
        changed = None if since is None else self.changes.since(since)

        def readable_names() -> list[str]:
            # what the principal may not read is not listed (as /data/queues), nor counted
            # against the cap; (the database only: iter_names touches no cache of the loop's)
            names = matching_topic_queues(filters, store.index.iter_names)
            return [name for name in names if access.may_read_queue(who, name)]

        if changed is None:
            names = await asyncio.to_thread(readable_names)
        else:
            names = [name for name in matching_topic_queues(filters, lambda prefix: (
                q for q in changed if q.startswith(prefix))) if access.may_read_queue(who, name)]
        if len(names) > MAX_TOPIC_QUEUES:
            raise AdminError(400, f"the filters match {len(names)} topic queues, more than {MAX_TOPIC_QUEUES} "
                             "in one listing: read with narrower filters")
        rows: list[dict[str, Any]] = []
        for i, name in enumerate(names):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            offsets = await self.offsets(name)
            if offsets is not None:
                rows.append({"queue": name, **offsets})
        return web.json_response({"queues": rows, "cursor": cursor, "complete": changed is None})
