"""The gateway's side of the event rules engine (``bridge/rules``): each rule's source queues read
through the delivery core's cursor with the rule's durable consumer offset, its topic filters
held in the MQTT wildcard filters (so every matching publish of any protocol is indexed into the
queue it reads), the store's notify waking it, and the MQTT publish path for its topic and
dead-letter targets; the event schemas the engine keeps. The one module of the gateway that
knows the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bridge.rules.book import TABLE, RuleBook
from bridge.rules.engine import RulesEngine
from bridge.rules.schemas import TABLE as SCHEMAS_TABLE
from bridge.rules.schemas import VERSIONS_TABLE, SchemaBook
from bridge.rules.targets.topic import Republished
from protocols.mqtt.packets import Publish
from protocols.mqtt.properties import Properties
from store import StoredMessage

from .config import ConfigError
from .core.cursor import Cursor
from .core.group import group_start
from .interop import queue_for_filter

if TYPE_CHECKING:
    from cache import QueueCache
    from store import MessageStore

    from .mqtt.broker import MQTTBroker

log = logging.getLogger("tidemq.rules")

PUBLISHER_ID = "tidemq-rules"  # the client id a rule's republished messages carry


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


class GatewayRuleHost:
    """``bridge.rules.engine.RuleHost`` over a standalone node's store and MQTT broker."""

    def __init__(self, store: MessageStore, mqtt: MQTTBroker) -> None:
        self._store = store
        self._mqtt = mqtt

    def open_source(self, consumer: str, topic_filter: str, *, resume: bool) -> CursorSource:
        source = CursorSource(self._store, self._mqtt.cache, consumer, queue_for_filter(topic_filter), resume=resume)
        self._mqtt.wildcards.hold(topic_filter, consumer, True)  # (in the same turn: no publish comes between)
        return source

    def close_source(self, topic_filter: str, consumer: str) -> None:
        self._mqtt.wildcards.release(topic_filter, consumer)

    def queue_of(self, topic_filter: str) -> str:
        return queue_for_filter(topic_filter)

    def offsets_of(self, queue: str) -> tuple[int, int]:
        return self._store.min_offset_now(queue), self._store.max_offset_now(queue)

    async def offset_at_time(self, queue: str, timestamp_ms: int) -> int:
        return await self._store.offset_for_timestamp(queue, timestamp_ms)  # (as remoting's SEARCH_OFFSET_BY_TIMESTAMP)

    def save_offset(self, consumer: str, queue: str, offset: int) -> None:
        self._store.save_offset_now(consumer, queue, offset)

    async def republish(self, messages: Sequence[Republished]) -> None:
        await self._mqtt.publish([Publish(m.topic, m.body, m.qos, False, properties=Properties(
            content_type=m.content_type, user_properties=list(m.user_properties))) for m in messages], PUBLISHER_ID)


class Rules:
    """The running engine and the notify feed that wakes its rules."""

    def __init__(self, store: MessageStore, mqtt: MQTTBroker) -> None:
        schemas = SchemaBook(store.table(SCHEMAS_TABLE), store.table(VERSIONS_TABLE))
        self.engine = RulesEngine(RuleBook(store.table(TABLE)), GatewayRuleHost(store, mqtt), schemas)
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
