"""GatewayStore: the store as a gateway node's MQTT broker sees it (``--role gateway``): its
``gateway.ports.QueueStore``, and the queue cache's message source.

The broker reads synchronously: it pulls from its cursors (through the queue cache) inside one
turn of the event loop. On a gateway node the store is a network
hop away (``RemoteStore``), so the synchronous calls are answered from what this node knows,
and a read it cannot answer yet starts a fetch and says "nothing new"; when the fetch is back,
a local notify event for the queue wakes its readers, and their next read gets it. That is the
push-pull model of the design: a notify, then a pull by offset. For the queues read on this node
the pull comes first: the store node's notify starts a fetch of the new part, and the local
notify follows it, so readers wake once, to messages already here.

A read by commitlog position (a resend, a shared message given back) is never answered
synchronously: ``read_at`` raises PositionNotLoadedError -- None would say retention removed the
message, and the broker would settle it -- and ``read_positions`` asks the store node.

What a synchronous call needs beyond reads -- a queue's offsets before a subscription starts
at its end, a shared group's committed offset -- is fetched first with the ``ensure_*``
coroutines by the node's ports (``gateway.cluster.mqtt_node.ClusterReads``: the connection is
not read meanwhile), and the synchronous call then finds it here.

When the link goes down (the store node restarts; a replicated store's leader dies and another
is elected), the node keeps its clients for up to ``failover_s`` while it links again: writes
(puts, session writes, retained entries) wait and are sent again on the new link, in the order
they were first sent; reads wait; once linked, the node says again what the store node kept
for the old link only (notify routing, clean sessions' wildcard filters: ``on_relinked``) and its
readers read afresh (the writes' rules: failover_writes.py). Past ``failover_s`` the node drops
its clients (``on_lost``).

A fetched batch goes to the node's queue cache (``answers``: its ``offer``), for the read at
the offset it was fetched for: the answer comes back asynchronously, the cache reads
synchronously, so the cache holds it, counted against its memory bound, until that read takes
it (into the window, or around it for a reader behind the window). One cache on the node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Container, Hashable, Iterable, Iterator, Sequence
from typing import TypeVar

from cache import QueueCache
from store import GetResult, GetStatus, Message, PositionNotLoadedError, PutResult, StoreClosedError, StoredMessage, StoreError
from store import NotifyHub, NotifySubscription, now_ms, receipt_tails

from .failover_writes import FailoverWrites
from .remote_store import RemoteStore, RemoteStoreError

log = logging.getLogger("tidemq.cluster")

T = TypeVar("T")

FAILOVER_S = 15.0  # clients are kept this long while the link to the store node is down
WATCH_S = 0.5  # how often a replicated store's leader is looked up (a link to an old one is left)
READS_IN_FLIGHT = 256  # reads by position sent to the store node before their answers
PREFETCH_MESSAGES = 64  # a store read asks for at least this many messages
MAX_FETCH_MESSAGES = 1024  # and at most this many (the store node's own limit)


class GatewayStore:
    def __init__(self, remote: RemoteStore, reconnect: Callable[[], Awaitable[RemoteStore]] | None = None,
                 relink_s: float = 0.5, failover_s: float = FAILOVER_S,
                 leader: Callable[[], Awaitable[tuple[str, int]]] | None = None) -> None:
        self.remote = remote
        self._reconnect = reconnect  # a new link to the store node, when this one is lost
        # where a replicated store's leader serves now (etcd): a link elsewhere is left, even one
        # that looks alive (a stopped or cut-off old leader never closes it)
        self._leader = leader
        self._relink_s = relink_s  # the first wait before linking again (then doubling, up to 5 s)
        self.failover_s = failover_s  # how long clients are kept while linking again
        self.linked = asyncio.Event()  # set while the link is up
        self.on_lost: Callable[[], None] | None = None  # no link for failover_s (the node drops its clients)
        self.on_relinked: Callable[[], None] | None = None  # linked again (the node says again what it holds)
        self.after_relink: list[Callable[[], None]] = []  # linked again: others following the store (AMQP relay)
        self.relinks = 0  # links made again after a loss (metrics, tests)
        # writes sent again through a failover, in order (failover_writes.py)
        self.writes = FailoverWrites(lambda: self.remote, lambda: self.linked.is_set() and self.remote.link.is_open,
                                     lambda: self.failover_s)
        self.node_id = ""
        self.producer_id = secrets.token_hex(8)  # this process's puts: numbered from 1 (store/write/idempotence.py)
        self._put_seq = itertools.count(1)
        self._closing = False
        self.msg_id_prefix = remote.msg_id_prefix
        self.notify = NotifyHub()
        self._max: dict[str, int] = {}  # queue -> max offset, from notify events and reads
        self._min: dict[str, int] = {}
        self.answers: QueueCache | None = None  # the node's queue cache: fetched batches go there
        self._fetching: set[tuple[str, int]] = set()
        self._consumer_offsets: dict[tuple[str, str], int | None] = {}
        self._tables: dict[str, RemoteTable] = {}
        # queues read on this node (the GatewayNode's reader counts): notify fetches their news first
        self.read_here: Container[str] = frozenset()
        self._tasks: set[asyncio.Task[None]] = set()
        self.fetches = 0  # store reads this node made (metrics: store reads per published message)
        self.notify_messages = 0  # NOTIFY messages the store node sent here
        self.notify_events = 0

    async def start(self, node_id: str) -> None:
        self.node_id = node_id
        await self.remote.subscribe_notify(self._on_notify, node_id)
        self.linked.set()
        if self._reconnect is not None:
            self._spawn(self._keep_linked())
        if self._leader is not None:
            self._spawn(self._leave_old_leaders())

    @property
    def connected(self) -> bool:
        return self.remote.link.is_open

    async def close(self) -> None:
        self._closing = True
        self.writes.close(StoreClosedError("the gateway node is closing"))
        for task in list(self._tasks):
            task.cancel()
        self.notify.close()
        await self.remote.close()

    async def _keep_linked(self) -> None:
        """When the link to the store node goes down: forget what was learned through it and
        link again, every ``relink_s`` at first, then up to every 5 s. Clients are kept
        meanwhile; past ``failover_s`` the node drops them (``on_lost``: they reconnect, through
        any node, to the sessions as last saved)."""
        assert self._reconnect is not None
        while True:
            await asyncio.shield(self.remote.link.closed)  # (a cancel here must not cancel the link's future)
            if self._closing:
                return
            self.linked.clear()
            lost_at = time.monotonic()
            log.error("lost the link to the store node node_id=%s", self.node_id)
            self._forget()
            delay = self._relink_s
            while True:
                await asyncio.sleep(delay)
                self.writes.expire()
                if not self.writes.refusing and time.monotonic() - lost_at >= self.failover_s:
                    # what waited is not sent later: its clients never had its answer, and may
                    # be on another node by then, with newer sessions
                    self.writes.refuse()
                    log.error("no store node for %.0f s: clients dropped node_id=%s", self.failover_s, self.node_id)
                    if self.on_lost is not None:
                        self.on_lost()
                try:
                    remote = await self._reconnect()
                    await remote.subscribe_notify(self._on_notify, self.node_id)
                    break
                except (OSError, StoreError) as exc:
                    log.warning("store node still unreachable node_id=%s error=%s", self.node_id, exc)
                    delay = min(delay * 2, 5.0)
            remote.on_kick = self.remote.on_kick
            self.remote, self.msg_id_prefix = remote, remote.msg_id_prefix
            self.relinks += 1
            log.info("linked to the store node again node_id=%s after_s=%.2f", self.node_id, time.monotonic() - lost_at)
            self._relinked()

    async def _leave_old_leaders(self) -> None:
        """Every WATCH_S: when the group's leader is not the node this link goes to, close the
        link (``_keep_linked`` then links to the leader)."""
        assert self._leader is not None
        while True:
            await asyncio.sleep(WATCH_S)
            remote = self.remote
            if not self.linked.is_set() or not remote.link.is_open:
                continue
            try:
                leader = await self._leader()
            except (OSError, StoreError) as exc:  # (no leader now, or etcd away: nothing to say)
                log.debug("store group leader unknown error=%s", exc)
                continue
            if remote is self.remote and remote.address is not None and leader != remote.address:
                log.warning("the store group has another leader: leaving the old one node_id=%s old=%s new=%s",
                            self.node_id, remote.address, leader)
                remote.link.close()

    def _relinked(self) -> None:
        """On the new link, in this order: what the store node kept for the old link only (the
        node's ``on_relinked``: notify routing, filter holds), the writes that waited, the
        consumer offsets committed here (a one-way commit the old link took may be lost); the
        node's session writes follow at the end of this turn."""
        self.writes.refusing = False
        if self.on_relinked is not None:
            self.on_relinked()
        for hook in self.after_relink:
            hook()
        self.linked.set()
        self.writes.send_waiting()
        for (consumer, queue), offset in self._consumer_offsets.items():
            if offset is not None:
                self.remote.commit_offset_nowait(consumer, queue, offset)

    def _forget(self) -> None:
        self._max.clear()
        self._min.clear()
        self._fetching.clear()

    def _on_notify(self, events: dict[str, int]) -> None:
        """A notify from the store node, handled a turn later: after the answers the link read
        before it (``_write_through`` knows what this node put by then)."""
        asyncio.get_running_loop().call_soon(self._notified, events)

    def _notified(self, events: dict[str, int]) -> None:
        """The store node says queues grew. For a queue whose end this node knew, the new part
        is fetched first and the queue's readers are woken when it is here (by ``_fetch``):
        woken at once, each would find nothing yet, ask for it, and be woken again."""
        self.notify_messages += 1
        self.notify_events += len(events)
        known = self._max
        fetching = self._fetching
        read_here = self.read_here
        now: dict[str, int] = {}
        for queue, offset in events.items():
            if queue not in read_here:  # (a broadcast: remembered, its end would go stale here)
                now[queue] = offset
                continue
            end = known.get(queue)
            if end is not None and end >= offset:
                continue  # (nothing this node did not know)
            known[queue] = offset
            if end is None or (queue, end) in fetching:
                now[queue] = offset
                continue
            fetching.add((queue, end))
            self._spawn(self._fetch(queue, end, min(max(offset - end, PREFETCH_MESSAGES), MAX_FETCH_MESSAGES)))
        if now:
            self.notify.publish(now)

    def subscribe_notify(self) -> NotifySubscription:
        return self.notify.subscribe()

    def listen_notify(self, listener: Callable[[dict[str, int]], None]) -> None:
        """``MessageStore.listen_notify``: the events this node publishes, as they are published."""
        self.notify.listen(listener)

    def unlisten_notify(self, listener: Callable[[dict[str, int]], None]) -> None:
        self.notify.unlisten(listener)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """``MessageStore.after_commit``: here no commit is under way (events come from the
        store node): on the loop's next turn."""
        self.notify.after_commit(callback)

    # -- writing ------------------------------------------------------------------------------
    def put_batch_nowait(self, items: Iterable[tuple[Message, Sequence[str]]]) -> asyncio.Future[Sequence[PutResult]]:
        """With the node's queue cache, the results carry queue offsets and the messages go to
        the cache as stored (``_write_through``); without, only positions (the MQTT gateway
        reads no queue offset)."""
        batch = list(items)
        through = self.answers is not None
        if through:
            stamp_born(batch)
        relinks = self.relinks
        stored = (lambda results: self._write_through(batch, results, relinks)) if through else None
        if self._reconnect is None:
            return self.through_failover(lambda remote: remote.put_batch_nowait(batch, queue_offsets=through,
                                                                                stored=stored))
        # numbered: sent again through a failover, it is answered as the first time, not written twice
        producer = (self.producer_id, next(self._put_seq))
        return self.through_failover(lambda remote: remote.put_batch_nowait(batch, queue_offsets=through,
                                                                            producer=producer, stored=stored))

    def _write_through(self, batch: list[tuple[Message, Sequence[str]]], results: Sequence[PutResult],
                       relinks: int) -> None:
        """This node's own messages, as stored, to its queue cache for the queues it follows at
        their end (``QueueCache.take_tail``), and their readers woken: they are not read back
        from the store node. The store node answers a put before it notifies its commit
        (store_service.py) and this node handles a notify a turn after it is read, so the
        notify then says nothing new here. Not after a failover (the readers read afresh) nor
        for what cannot be built from the receipt (the cache then stops following the queue,
        and its readers read the store)."""
        cache = self.answers
        if cache is None or relinks != self.relinks or not cache.following:
            return
        built = receipt_tails(batch, results, cache.following)
        events: dict[str, int] = {}
        known, read_here = self._max, self.read_here
        for queue, messages in built.items():
            if queue not in read_here:
                continue
            end = messages[-1].queue_offset + 1
            if end - messages[0].queue_offset == len(messages):  # (one put's messages are together in a queue)
                cache.take_tail(queue, GetResult(GetStatus.FOUND, messages, end, self._min.get(queue, 0), end))
            if known.get(queue, -1) < end:
                known[queue] = events[queue] = end
        if events:
            self.notify.publish(events)

    def put_each_nowait(self, items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None = None,
                        ) -> tuple[asyncio.Future[Sequence[PutResult]], dict[int, StoreError]]:
        """``MessageStore.put_each_nowait``'s shape; the store node's limits are checked there,
        so here the batch is one put: a message it refuses fails the batch (weaker than embedded)."""
        return self.put_batch_nowait(items), {}

    async def put_batch(self, items: Iterable[tuple[Message, Sequence[str]]]) -> Sequence[PutResult]:
        return await self.put_batch_nowait(items)

    def through_failover(self, send: Callable[[RemoteStore], Awaitable[T]], key: Hashable | None = None
                         ) -> asyncio.Future[T]:
        """``send(remote)`` now, and again through a failover (failover_writes.py)."""
        if self._reconnect is None:
            return asyncio.ensure_future(send(self.remote))
        return self.writes.send(send, key)

    # -- reading ------------------------------------------------------------------------------
    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                tag_hashes: frozenset[int] | None = None) -> GetResult:
        key = (queue, offset)
        high = self._max.get(queue)
        low = self._min.get(queue, 0)
        if high is not None and offset == high:
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, low, high)
        if key not in self._fetching and self.linked.is_set():  # (linked again: every reader is woken)
            self._fetching.add(key)
            self._spawn(self._fetch(queue, offset, max(max_messages, PREFETCH_MESSAGES), max_bytes, tag_hashes))
        # not here yet: "nothing new"; the fetch's notify wakes the readers
        return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, low, offset if high is None else max(offset, high))

    async def _fetch(self, queue: str, offset: int, max_messages: int, max_bytes: int = 4 << 20,
                     tag_hashes: frozenset[int] | None = None) -> None:
        try:
            result = await self.remote.get(queue, offset, max_messages, max_bytes, tag_hashes)
        except RemoteStoreError as exc:
            log.warning("store read failed queue=%s offset=%d error=%s", queue, offset, exc)
            if queue in self._max and self.linked.is_set():  # the readers try for themselves (a notify may wait on this fetch)
                self.notify.publish({queue: self._max[queue]})
            return
        finally:
            self._fetching.discard((queue, offset))
        self.fetches += 1
        if queue not in self.read_here:
            return  # no longer read here: its offsets would go stale (see ``forget``)
        self._min[queue] = result.min_offset
        if self._max.get(queue, -1) < result.max_offset:
            self._max[queue] = result.max_offset
        # an answer worth holding for its reader: messages, or where to go instead (an offset
        # error, a filtered scan's next offset); an empty answer at the queue's end (nothing
        # new, or a queue never written) says nothing the end does not, and held it stood for
        # the queue after messages came (a session back on a topic not yet written missed them)
        cache = self.answers
        if cache is not None and (result.messages or offset != result.max_offset):
            window = cache.window(queue)
            if window is None or not window[0] <= offset < window[1]:  # (else written through meanwhile)
                cache.offer(queue, offset, result)
        self.notify.publish({queue: self._max.get(queue, result.max_offset)})

    def max_offset_now(self, queue: str) -> int:
        """As far as this node knows (``ensure_offsets`` first where it matters)."""
        return self._max.get(queue, 0)

    def min_offset_now(self, queue: str) -> int:
        return self._min.get(queue, 0)

    async def ensure_offsets(self, queues: Iterable[str]) -> None:
        """Learn the offsets of the queues this node has not heard of; only for queues read
        here (counted before the call, so that their notify events come here from then on)."""
        unknown = [q for q in queues if q not in self._max]
        if unknown:
            for queue, (low, high) in (await self.remote.offsets(unknown)).items():
                if queue in self.read_here:
                    self._min[queue] = low
                    self._max[queue] = max(high, self._max.get(queue, 0))

    def forget(self, queue: str) -> None:
        """This node no longer reads ``queue``, so the store node sends its notify events
        elsewhere: what this node knows of its end would go stale (taken for the end, it would
        hold back messages published meanwhile), and so would what the cache holds for it (a
        subscription refused after a fetch for it: no reader ever takes that answer). The next
        reader reads the queue afresh."""
        self._max.pop(queue, None)
        self._min.pop(queue, None)
        if self.answers is not None:
            self.answers.drop(queue)

    def read_at(self, position: int) -> StoredMessage | None:
        """A gateway node holds no message by position (what it fetches, it fetches by queue
        and offset), so it can never say that one is gone: ``read_positions`` asks the store."""
        raise PositionNotLoadedError(position)

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]:
        """The messages at ``positions``, read from the store node (pipelined on the link); None
        for one the store node no longer has (retention removed it). RemoteStoreError when the
        store node cannot answer: then nothing is known about any of them."""
        wanted = list(dict.fromkeys(positions))
        found: dict[int, StoredMessage | None] = {}
        for start in range(0, len(wanted), READS_IN_FLIGHT):
            batch = wanted[start:start + READS_IN_FLIGHT]
            found.update(zip(batch, await asyncio.gather(*(self.remote.read_at(p) for p in batch)), strict=True))
        return found

    # -- consumer offsets and tables ----------------------------------------------------------
    def get_offset_now(self, consumer: str, queue: str) -> int | None:
        return self._consumer_offsets.get((consumer, queue))

    async def ensure_consumer_offset(self, consumer: str, queue: str) -> None:
        if (consumer, queue) not in self._consumer_offsets:
            self._consumer_offsets[(consumer, queue)] = await self.remote.get_offset(consumer, queue)

    def commit_offset_now(self, consumer: str, queue: str, offset: int) -> None:
        self._consumer_offsets[(consumer, queue)] = offset
        self.remote.commit_offset_nowait(consumer, queue, offset)

    def save_offset_now(self, consumer: str, queue: str, offset: int) -> None:
        """A group's start: the store node writes it through (sent in order on the link, ahead
        of anything this node sends after it)."""
        self._consumer_offsets[(consumer, queue)] = offset
        self.remote.commit_offset_nowait(consumer, queue, offset, durable=True)

    def kv_put_sent(self, table: str, key: str, value: bytes) -> asyncio.Future[None]:
        """``RemoteStore.kv_put_sent`` through a failover (``through_failover``: the newest value
        of a key wins)."""
        return self.through_failover(lambda remote: remote.kv_put_sent(table, key, value), ("kv", table, key))

    def kv_delete_sent(self, table: str, key: str) -> asyncio.Future[None]:
        """A delete is the key's newest value too (``kv_put_sent``)."""
        return self.through_failover(lambda remote: remote.kv_delete_sent(table, key), ("kv", table, key))

    def retained_set(self, topic: str, position: int | None) -> asyncio.Future[None]:
        return self.through_failover(lambda remote: remote.retained_set(topic, position), ("retained", topic))

    def table(self, name: str) -> RemoteTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = RemoteTable(self, name)
        return table

    def _spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def stamp_born(batch: list[tuple[Message, Sequence[str]]]) -> None:
    """Give the messages without a born time this node's clock, once for the batch (they came
    in the same turn): a read returns it, and the node's write-through must know it."""
    now = None
    for message, _ in batch:
        if message.born_timestamp is None:
            if now is None:
                now = now_ms()
            message.born_timestamp = now


class RemoteTable:
    """A KV table of the store node (``gateway.ports.KeyValueTable``): writes go out at once,
    in order on the link, and again through a failover (the newest value of a key wins, a
    delete included); a read is a request."""

    def __init__(self, store: GatewayStore, name: str) -> None:
        self.store = store
        self.name = name

    async def load(self, key: str) -> bytes | None:
        return await self.store.remote.kv_get(self.name, key)

    def put(self, key: str, value: bytes) -> None:
        _unawaited(self.store.kv_put_sent(self.name, key, value), "put", self.name, key)

    def delete(self, key: str) -> None:
        _unawaited(self.store.kv_delete_sent(self.name, key), "delete", self.name, key)

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        return iter(())  # a gateway node loads sessions one by one, when their clients connect


def _unawaited(write: asyncio.Future[None], what: str, table: str, key: str) -> None:
    """A write no caller waits for: its failure (no store node within failover_s) is logged."""
    def done(f: asyncio.Future[None]) -> None:
        if not f.cancelled() and (exc := f.exception()) is not None:
            log.warning("store node write lost: %s table=%s key=%s error=%s", what, table, key, exc)
    write.add_done_callback(done)
