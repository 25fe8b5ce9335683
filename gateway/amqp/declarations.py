"""The node's AMQP declarations: exchanges, queues and bindings as clients declare, bind and
delete them (checked as RabbitMQ checks them), kept in the store's ``amqp.meta`` table and
restored from it at start. What runs on them -- notify, routing, dead-lettering -- is broker.py's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from protocols.amqp.frames import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    channel_error,
)
from store import KvTable, StoreError

from ..core.group import group_start
from ..interop import amqp_queue
from .model import (
    BUILTIN_EXCHANGES,
    DELAYED,
    Binding,
    Exchange,
    QueueDefinition,
    check_binding,
    check_exchange,
    check_queue_arguments,
    inequivalent,
    name_problem,
)
from .queues import QueueRuntime

if TYPE_CHECKING:
    from .broker import AMQPBroker
    from .channel import Channel


class Declarations:
    """The exchanges (by name), the queues at run time (by name) and their bindings, each durable
    one written to ``meta`` before it is declared to anyone (a StoreError leaves it undeclared)."""

    def __init__(self, broker: AMQPBroker, meta: KvTable) -> None:
        self._broker = broker  # (its queues run on it: QueueRuntime's host)
        self._meta = meta
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueRuntime] = {}
        # told when amq.topic's bindings change (the MQTT bridge's routes), when MQTT runs
        self.amq_topic_changed: Callable[[], None] | None = None

    def restore(self) -> None:
        """The built-in exchanges, then what ``meta`` holds: exchanges, queues, bindings."""
        for name, kind in BUILTIN_EXCHANGES.items():
            self.exchanges[name] = Exchange(name, kind, durable=True)
        bindings = []
        for key, raw in self._meta.items():
            kind, _, name = key.partition(":")
            if kind == "x":
                doc = json.loads(raw)
                self.exchanges[name] = Exchange(name, doc["type"], True, doc["auto_delete"], doc["internal"],
                                                doc["arguments"])
            elif kind == "q":
                definition = QueueDefinition.from_json(raw)
                self.open_queue(definition, restored=True)
            elif kind in ("b", "e"):
                bindings.append((kind, json.loads(raw)))
        for kind, doc in bindings:
            exchange = self.exchanges.get(doc["exchange"])
            if exchange is None:
                continue
            binding = Binding(doc["queue"], doc["routing_key"], doc["arguments"])
            if kind == "b" and doc["queue"] in self.queues:
                exchange.bindings.append(binding)
            elif kind == "e" and doc["queue"] in self.exchanges:
                exchange.exchange_bindings.append(binding)
        self._bindings_changed(self.exchanges["amq.topic"])  # (MQTT publishes reach the restored ones)

    # -- exchanges -----------------------------------------------------------------------------
    def declare_exchange(self, channel: Channel, m: commands.Exchange.Declare) -> None:
        name = m.exchange
        existing = self.exchanges.get(name)
        if m.passive:
            if existing is None:
                raise channel_error(NOT_FOUND, f"no exchange '{name}'", channel.number, m)
            return
        if existing is not None:
            problem = inequivalent("exchange", name, existing.settings(),
                                   Exchange(name, m.exchange_type, m.durable, m.auto_delete, m.internal,
                                            dict(m.arguments or {})).settings())
            if problem:
                raise channel_error(PRECONDITION_FAILED, problem, channel.number, m)
            return
        if name.startswith("amq.") or not name:
            raise channel_error(ACCESS_REFUSED, f"exchange name '{name}' is reserved", channel.number, m)
        problem = name_problem("exchange", name) or check_exchange(m.exchange_type, dict(m.arguments or {}))
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, channel.number, m)
        exchange = Exchange(name, m.exchange_type, m.durable, m.auto_delete, m.internal, dict(m.arguments or {}))
        if exchange.durable:  # (written first: StoreError leaves no exchange behind)
            self._meta.put(f"x:{name}", exchange.definition())
        self.exchanges[name] = exchange

    def delete_exchange(self, channel: Channel, m: commands.Exchange.Delete) -> None:
        exchange = self.exchanges.get(m.exchange)
        if exchange is None:
            return  # RabbitMQ: deleting a missing exchange succeeds
        if m.exchange in BUILTIN_EXCHANGES:
            raise channel_error(ACCESS_REFUSED, f"exchange '{m.exchange}' is built in", channel.number, m)
        if m.if_unused and (exchange.bindings or exchange.exchange_bindings):
            raise channel_error(PRECONDITION_FAILED, f"exchange '{m.exchange}' in use", channel.number, m)
        for binding in exchange.bindings:
            self._meta.delete("b:" + binding.key(exchange.name))
        for binding in exchange.exchange_bindings:
            self._meta.delete("e:" + binding.key(exchange.name))
        del self.exchanges[m.exchange]
        self._meta.delete(f"x:{m.exchange}")
        for source in list(self.exchanges.values()):  # bindings to it from other exchanges go too
            kept = [b for b in source.exchange_bindings if b.queue != m.exchange]
            for binding in source.exchange_bindings:
                if binding.queue == m.exchange:
                    self._meta.delete("e:" + binding.key(source.name))
            source.exchange_bindings = kept

    # -- queues --------------------------------------------------------------------------------
    def open_queue(self, definition: QueueDefinition, owner: object | None = None, *,
                   restored: bool = False) -> QueueRuntime:
        """A queue at run time: its consumers are a consumer group of the delivery core. A new
        queue starts at its store queue's end (what an earlier queue of the same name left there
        is not its), written through before the queue is declared to anyone: a message confirmed
        a moment later is delivered after any crash. A queue restored at start-up resumes at its
        saved offset (without one, a data dir of an earlier version: at its oldest message)."""
        name = amqp_queue(definition.name)
        start = group_start(self._broker.store, f"amqp:{definition.name}", name, resume=restored, unsaved_at_oldest=True)
        if not restored:
            self._broker.cache.drop(name)
        queue = self.queues[definition.name] = QueueRuntime(self._broker, definition, start, owner, restored=restored)
        return queue

    def queue_for(self, channel: Channel, name: str, method: Any) -> QueueRuntime:
        queue = self.queues.get(name)
        if queue is None:
            raise channel_error(NOT_FOUND, f"no queue '{name}'", channel.number, method)
        if queue.owner is not None and queue.owner is not channel.connection:
            raise channel_error(RESOURCE_LOCKED, f"queue '{name}' is exclusive to another connection",
                                channel.number, method)
        return queue

    def declare_queue(self, channel: Channel, m: commands.Queue.Declare) -> QueueRuntime:
        name = m.queue or f"amq.gen-{uuid.uuid4().hex[:22]}"
        conn = channel.connection
        existing = self.queues.get(name)
        if m.passive:
            if existing is None:
                raise channel_error(NOT_FOUND, f"no queue '{name}'", channel.number, m)
            conn.last_queue = name
            queue = self.queue_for(channel, name, m)
            queue.touch()
            return queue
        arguments = dict(m.arguments or {})
        if existing is not None:
            self.queue_for(channel, name, m)  # exclusivity
            received = QueueDefinition(name, m.durable, m.exclusive, m.auto_delete, arguments)
            problem = inequivalent("queue", name, existing.definition.settings(), received.settings())
            if problem:
                raise channel_error(PRECONDITION_FAILED, problem, channel.number, m)
            conn.last_queue = name
            existing.touch()
            return existing
        if name.startswith("amq.") and m.queue:
            raise channel_error(ACCESS_REFUSED, f"queue name '{name}' is reserved", channel.number, m)
        problem = name_problem("queue", name) or check_queue_arguments(arguments)
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, channel.number, m)
        definition = QueueDefinition(name, m.durable, m.exclusive, m.auto_delete, arguments)
        queue = self.open_queue(definition, conn if m.exclusive else None)
        if definition.durable and not definition.exclusive:
            try:
                self._meta.put(f"q:{name}", definition.to_json())
            except StoreError:  # not declared: gone from memory too (a new queue has no consumer yet)
                del self.queues[name]
                raise
        # every queue is bound to the default exchange by its name (implicitly: see route())
        conn.last_queue = name
        if m.exclusive:
            owned = conn.exclusive_queues
            if not isinstance(owned, set):
                owned = conn.exclusive_queues = set()  # (its first: until then the shared empty one)
            owned.add(name)
        return queue

    def delete_queue(self, channel: Channel, m: commands.Queue.Delete) -> int:
        name = m.queue or channel.connection.last_queue
        queue = self.queues.get(name)
        if queue is None:
            return 0  # as RabbitMQ: deleting a missing queue succeeds
        self.queue_for(channel, name, m)
        if m.if_unused and queue.consumers:
            raise channel_error(PRECONDITION_FAILED, f"queue '{name}' in use", channel.number, m)
        if m.if_empty and queue.ready_count():
            raise channel_error(PRECONDITION_FAILED, f"queue '{name}' not empty", channel.number, m)
        return self.remove_queue(queue)

    def remove_queue(self, queue: QueueRuntime) -> int:
        self._meta.delete(f"q:{queue.name}")  # (first: StoreError leaves the queue as it was)
        count = queue.ready_count()
        queue.deleted = True
        for consumer in list(queue.consumers.values()):
            consumer.channel.consumer_cancelled(consumer)
        self.queues.pop(queue.name, None)
        for exchange in list(self.exchanges.values()):
            kept = [b for b in exchange.bindings if b.queue != queue.name]
            for binding in exchange.bindings:
                if binding.queue == queue.name:
                    self._meta.delete("b:" + binding.key(exchange.name))
            if len(kept) != len(exchange.bindings):
                exchange.bindings = kept
                self._bindings_changed(exchange)
            self._auto_delete_exchange(exchange)
        if queue.group.counts is not None:
            queue.group.counts.clear()
        # the store keeps the messages until retention; the queue's cursor goes to the end
        self._broker.store.commit_offset_now(queue.consumer_name, queue.store_queue,
                                     self._broker.store.max_offset_now(queue.store_queue))
        self._broker.cache.drop(queue.store_queue)
        return count

    def after_consumer_left(self, queue: QueueRuntime) -> None:
        if queue.definition.auto_delete and not queue.consumers and not queue.deleted:
            self.remove_queue(queue)

    def _auto_delete_exchange(self, exchange: Exchange) -> None:
        if (exchange.auto_delete and not exchange.bindings and not exchange.exchange_bindings
                and exchange.name not in BUILTIN_EXCHANGES):
            self.exchanges.pop(exchange.name, None)
            self._meta.delete(f"x:{exchange.name}")

    # -- bindings ------------------------------------------------------------------------------
    def bind(self, channel: Channel, queue_name: str, exchange_name: str, routing_key: str,
             arguments: dict[str, Any]) -> None:
        queue = self.queue_for(channel, queue_name, None)
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            raise channel_error(NOT_FOUND, f"no exchange '{exchange_name}'", channel.number)
        if exchange_name == "":
            raise channel_error(ACCESS_REFUSED, "the default exchange cannot be bound", channel.number)
        problem = check_binding(exchange, arguments)
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, channel.number)
        binding = Binding(queue.name, routing_key, dict(arguments))
        if any(b.key(exchange.name) == binding.key(exchange.name) for b in exchange.bindings):
            return
        if exchange.durable and queue.definition.durable and not queue.definition.exclusive:
            self._meta.put("b:" + binding.key(exchange.name), json.dumps(
                {"exchange": exchange.name, "queue": queue.name, "routing_key": routing_key,
                 "arguments": binding.arguments}, default=str).encode())
        exchange.bindings.append(binding)
        self._bindings_changed(exchange)

    def unbind(self, channel: Channel, queue_name: str, exchange_name: str, routing_key: str,
               arguments: dict[str, Any]) -> None:
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            raise channel_error(NOT_FOUND, f"no exchange '{exchange_name}'", channel.number)
        self.queue_for(channel, queue_name, None)
        key = Binding(queue_name, routing_key, dict(arguments)).key(exchange.name)
        self._meta.delete("b:" + key)  # (first: StoreError leaves the binding)
        exchange.bindings = [b for b in exchange.bindings if b.key(exchange.name) != key]
        self._bindings_changed(exchange)
        self._auto_delete_exchange(exchange)

    def bind_exchange(self, channel: Channel, destination: str, source: str, routing_key: str,
                      arguments: dict[str, Any], method: Any) -> None:
        """exchange.bind: what ``source`` routes by this binding goes on through ``destination``."""
        src, dst = self.exchanges.get(source), self.exchanges.get(destination)
        if src is None or dst is None:
            missing = source if src is None else destination
            raise channel_error(NOT_FOUND, f"no exchange '{missing}'", channel.number, method)
        if "" in (source, destination):
            raise channel_error(ACCESS_REFUSED, "the default exchange cannot be bound", channel.number, method)
        if dst.type == DELAYED:  # (its delay applies to publishes to it, not to what other exchanges route on)
            raise channel_error(PRECONDITION_FAILED, f"'{destination}' delays what is published to it only: not a destination", channel.number, method)
        problem = check_binding(src, arguments)
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, channel.number, method)
        binding = Binding(destination, routing_key, dict(arguments))
        if any(b.key(source) == binding.key(source) for b in src.exchange_bindings):
            return
        if src.durable and dst.durable:
            self._meta.put("e:" + binding.key(source), json.dumps(
                {"exchange": source, "queue": destination, "routing_key": routing_key,
                 "arguments": binding.arguments}, default=str).encode())
        src.exchange_bindings.append(binding)
        self._bindings_changed(src)

    def unbind_exchange(self, channel: Channel, destination: str, source: str, routing_key: str,
                        arguments: dict[str, Any], method: Any) -> None:
        src = self.exchanges.get(source)
        if src is None or destination not in self.exchanges:
            raise channel_error(NOT_FOUND, f"no exchange '{source if src is None else destination}'",
                                channel.number, method)
        key = Binding(destination, routing_key, dict(arguments)).key(source)
        self._meta.delete("e:" + key)  # (first: StoreError leaves the binding)
        src.exchange_bindings = [b for b in src.exchange_bindings if b.key(source) != key]
        self._bindings_changed(src)
        self._auto_delete_exchange(src)

    def _bindings_changed(self, exchange: Exchange) -> None:
        if exchange.name == "amq.topic" and self.amq_topic_changed is not None:
            self.amq_topic_changed()
