"""The gateway's side of the event rules engine (``bridge/rules``): each rule's source queues read
through the delivery core's cursor with the rule's durable consumer offset, its topic filters
held in the MQTT wildcard filters (so every matching publish of any protocol is indexed into the
queue it reads), the store's notify waking it, and the MQTT publish path for its topic and
dead-letter targets; the event schemas the engine keeps. Rules run where the store is: a
standalone node (over its MQTT broker) or a store node of a cluster while it serves (a
replicated group's leader). The one module of the gateway that knows the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bridge.rules.book import TABLE, RuleBook
from bridge.rules.engine import RulesEngine, parse_declared
from bridge.rules.schemas import TABLE as SCHEMAS_TABLE
from bridge.rules.schemas import VERSIONS_TABLE, SchemaBook
from bridge.rules.targets.topic import Republished
from protocols.mqtt.packets import Publish
from protocols.mqtt.properties import Properties
from store import PutResult, StoredMessage

from .config import ConfigError
from .core.cursor import Cursor
from .core.group import group_start
from .interop import queue_for_filter
from .mqtt.messages import StoreMessageFactory

if TYPE_CHECKING:
    from cache import QueueCache
    from store import MessageStore

    from .mqtt.queues import WildcardQueues
    from .ports import FilterRegistry, KeyValueTable, QueueStore

# publish(publishes, client_id): stored as that MQTT client's publishes; resolves once durable
Publisher = Callable[[list[Publish], str], Awaitable[Sequence[PutResult]]]

log = logging.getLogger("tidemq.rules")

PUBLISHER_ID = "tidemq-rules"  # the client id a rule's republished messages carry
MAX_LINKED_BOOKS = 64  # the schema sets a gateway node keeps compiled


class CursorSource:
    """One source queue of a rule (``bridge.rules.runner.EventSource``): the delivery core's
    cursor over the queue cache, its committed offset the store's consumer offset of the rule."""

    def __init__(self, store: MessageStore, cache: QueueCache, consumer: str, queue: str, *, resume: bool) -> None:
        self.queue = queue
        self._store = store
        self._cache = cache
        self._consumer = consumer
        self._committed = group_start(store, consumer, queue, resume=resume)
        self._cursor = Cursor(queue, self._committed)

    def read(self, max_messages: int) -> list[StoredMessage]:
        result = self._cursor.read(self._cache, max_messages, self._moved)
        if result is None:
            return []
        self._cursor.next_offset = result.next_offset
        return result.messages

    def commit(self, offset: int) -> None:
        self._committed = offset
        self._store.commit_offset_now(self._consumer, self.queue, offset)

    def lag(self) -> int:
        return max(0, self._store.max_offset_now(self.queue) - self._committed)

    def _moved(self, cursor: Cursor, old: int, new: int) -> None:
        log.warning("rule cursor moved consumer=%s queue=%s from=%d to=%d (retention removed messages, "
                    "or the queue was cut)", self._consumer, self.queue, old, new)
        self._committed = new


def store_node_publisher(store: MessageStore, wildcards: WildcardQueues) -> Publisher:
    """The publish path of a store node, which has no MQTT broker: each message put into the
    queues an MQTT publish to its topic goes to (its gateway nodes' wildcard filters, AMQP
    bindings to ``amq.topic``), as the store link's PUT expands them."""
    def publish(publishes: list[Publish], client_id: str) -> Awaitable[Sequence[PutResult]]:
        factory = StoreMessageFactory(client_id)
        return store.put_batch_nowait([(factory.message(p, p.topic), wildcards.queues_for(p.topic)) for p in publishes])
    return publish


class GatewayRuleHost:
    """``bridge.rules.engine.RuleHost`` over the node's store, its queue cache, the filters MQTT
    publishes are indexed by and the MQTT publish path (``publish``)."""

    def __init__(self, store: MessageStore, cache: QueueCache, filters: FilterRegistry, publish: Publisher,
                 may_deliver: Callable[[], bool] | None = None) -> None:
        self._store = store
        self._cache = cache
        self._filters = filters
        self._publish = publish
        self._may_deliver = may_deliver  # (a replicated group's leader: whether its lease is fresh)

    def open_source(self, consumer: str, topic_filter: str, *, resume: bool) -> CursorSource:
        source = CursorSource(self._store, self._cache, consumer, queue_for_filter(topic_filter), resume=resume)
        self._filters.hold(topic_filter, consumer, True)  # (in the same turn: no publish comes between)
        return source

    def close_source(self, topic_filter: str, consumer: str) -> None:
        self._filters.release(topic_filter, consumer)

    def queue_of(self, topic_filter: str) -> str:
        return queue_for_filter(topic_filter)

    def offsets_of(self, queue: str) -> tuple[int, int]:
        return self._store.min_offset_now(queue), self._store.max_offset_now(queue)

    async def offset_at_time(self, queue: str, timestamp_ms: int) -> int:
        return await self._store.offset_for_timestamp(queue, timestamp_ms)  # (as remoting's SEARCH_OFFSET_BY_TIMESTAMP)

    def save_offset(self, consumer: str, queue: str, offset: int) -> None:
        self._store.save_offset_now(consumer, queue, offset)

    def may_deliver(self) -> bool:
        return self._may_deliver is None or self._may_deliver()

    async def republish(self, messages: Sequence[Republished]) -> None:
        await self._publish([Publish(m.topic, m.body, m.qos, False, properties=Properties(
            content_type=m.content_type, user_properties=list(m.user_properties))) for m in messages], PUBLISHER_ID)


def check_declared(declared: Mapping[str, Any]) -> None:
    """ConfigError of event_rules when a declared rule is bad, before any store is open (a store
    node of a replicated group runs them only once it leads: a bad one must stop its start-up)."""
    try:
        parse_declared(declared)
    except ValueError as exc:
        raise ConfigError(f"event_rules: {exc}", "event_rules") from None


class Rules:
    """The running engine and the notify feed that wakes its rules."""

    def __init__(self, store: MessageStore, host: GatewayRuleHost) -> None:
        schemas = SchemaBook(store.table(SCHEMAS_TABLE), store.table(VERSIONS_TABLE))
        self.engine = RulesEngine(RuleBook(store.table(TABLE)), host, schemas)
        self._store = store
        self._feed: asyncio.Task[None] | None = None

    def start(self, declared: Mapping[str, Any], schemas: Mapping[str, Any]) -> None:
        """Store the ``schemas`` declared, then run the stored and ``declared`` rules (ConfigError
        of event_schemas or event_rules: a declared one is bad)."""
        try:
            self.engine.declare_schemas(schemas)
        except ValueError as exc:
            raise ConfigError(f"event_schemas: {exc}", "event_schemas") from None
        try:
            self.engine.start(declared)
        except ValueError as exc:
            raise ConfigError(f"event_rules: {exc}", "event_rules") from None
        self._feed = asyncio.get_running_loop().create_task(self._store.subscribe_notify().feed(self.engine.wake),
                                                             name="rules-notify")

    async def stop(self) -> None:
        if self._feed is not None:
            self._feed.cancel()
            self._feed = None
        await self.engine.stop()


class LinkedSchemas:
    """A gateway node's view of the event schemas its store node keeps (``gateway.http.deps.
    SchemaSource``): the current version of each name asked for, read over the store link when
    asked, so a schema put on the store node is checked at once; compiled once per version."""

    def __init__(self, store: QueueStore) -> None:
        self._table: KeyValueTable = store.table(SCHEMAS_TABLE)
        self._books: dict[tuple[tuple[str, bytes], ...], SchemaBook] = {}

    async def current(self, names: Iterable[str]) -> SchemaBook:
        wanted = sorted(set(names))
        found = await asyncio.gather(*(self._table.load(name) for name in wanted))
        key = tuple((name, raw) for name, raw in zip(wanted, found) if raw is not None)
        book = self._books.get(key)
        if book is None:
            if len(self._books) >= MAX_LINKED_BOOKS:
                self._books.clear()
            book = self._books[key] = SchemaBook(_Entries(dict(key)), _Entries({}))
        return book


class _Entries:
    """Schema entries read from the store node, as the table ``SchemaBook`` reads (read only)."""

    def __init__(self, entries: dict[str, bytes]) -> None:
        self._entries = entries

    def get(self, key: str) -> bytes | None:
        return self._entries.get(key)

    def put(self, key: str, value: bytes) -> None:
        raise TypeError("a gateway node does not change the event schemas: its store node does")

    def delete(self, key: str) -> None:
        raise TypeError("a gateway node does not change the event schemas: its store node does")

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        return ((k, v) for k, v in self._entries.items() if k.startswith(prefix))
