"""The node's AMQP state: exchanges with their bindings, queues at run time, routing of
publishes into the store, dead-lettering, and the notify loop that wakes queues with consumers."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pamqp import commands

from cache import QueueCache
from protocols.amqp.frames import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    channel_error,
    copy_properties,
)
from store import Message, MessageStore, StoredMessage, StoreError
from store import RateLimitedLog

from ..auth.authorize import Authorizer
from ..core.group import group_start
from ..deadlines import Deadlines, StalledReads
from ..interop import (
    AMQP_QUEUE_PREFIX,
    TopicSpace,
    amqp_queue,
    mqtt_topic_to_routing_key,
    routing_key_to_mqtt_topic,
    valid_mqtt_topic,
)
from ..stats import ProtocolStats
from ..tasks import cancel_and_wait
from .direct_reply import DirectReplies
from .messages import DEATHS, AMQPView, decoded_to_store_message, record_death
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
    routed_queues,
)
from .queues import QueueRuntime, take_places

if TYPE_CHECKING:
    from ..auth.passwords import PasswordFile
    from .channel import Channel
    from .connection import AMQPConnection
    from ..pressure import StorePressure

log = logging.getLogger("tidemq.amqp")


META_TABLE = "amqp.meta"


class AMQPBroker:
    def __init__(self, store: MessageStore, *, cache: QueueCache, authenticator: PasswordFile | None = None,
                 allow_anonymous: bool = True, frame_max: int = 131_072, channel_max: int = 2047,
                 heartbeat: int = 60, pressure: StorePressure | None = None,
                 housekeeping_interval_s: float = 1.0, authorizer: Authorizer | None = None,
                 connect_timeout_s: float = 10.0, mqtt_topics: TopicSpace | None = None,
                 cluster_name: str = "tidemq", read_timeout_s: float = 60.0) -> None:
        self.store = store
        self.cluster_name = cluster_name  # the node's name, told to clients in connection.start
        self.cache = cache
        self.authenticator = authenticator
        self.allow_anonymous = allow_anonymous
        self.frame_max = frame_max
        # the one message size limit (max_message_size): a body larger is refused at its
        # content header, a record larger (body, properties, queue list) by the store
        self.max_message_size = store.options.max_message_size
        self._failures = RateLimitedLog(log)  # housekeeping's writes, failing each second on a full disk
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueRuntime] = {}
        self.direct_replies = DirectReplies()  # amq.rabbitmq.reply-to's consumers
        self.connections: set[AMQPConnection] = set()
        self.pressure = pressure
        self.stats = ProtocolStats()
        self.authorizer = authorizer or Authorizer(None)  # the ACL and AMQP permissions
        self.connect_timeout_s = connect_timeout_s  # the handshake (to connection.open) comes within this
        self.deadlines = Deadlines()  # the connections' handshake timeouts and heartbeats
        self.stalled = StalledReads(read_timeout_s)  # connections silent in the middle of a frame
        self.housekeeping_interval_s = housekeeping_interval_s
        # the MQTT bridge through amq.topic (RabbitMQ's convention, see docs/amqp.md), when MQTT runs
        self.mqtt_topics = mqtt_topics
        self._amq_topic_changed = mqtt_topics.join(self.amq_topic_queues) if mqtt_topics is not None else None
        self._meta = store.table(META_TABLE)
        self._views: OrderedDict[int, AMQPView] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
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
                self._open_queue(definition, restored=True)
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
        notify = self.store.subscribe_notify()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(notify.feed(self._on_notify), name="amqp-notify"))
        self._tasks.append(loop.create_task(self._housekeeping(), name="amqp-housekeeping"))
        if self.pressure is not None:
            self.pressure.on_change(self._resource_alarm)
        log.info("amqp state restored exchanges=%d queues=%d", len(self.exchanges), len(self.queues))

    async def stop(self) -> None:
        for conn in list(self.connections):
            conn.shutdown()
        await cancel_and_wait(self._tasks)
        for queue in self.queues.values():
            queue.close()
        self.deadlines.close()
        self.stalled.close()

    def _queue_of(self, store_queue_name: str) -> QueueRuntime | None:
        """The declared queue whose store queue that is (a reader: store/retention/reclaim.py)."""
        if not store_queue_name.startswith(AMQP_QUEUE_PREFIX):
            return None
        return self.queues.get(store_queue_name[len(AMQP_QUEUE_PREFIX):])

    def reads(self, store_queue_name: str) -> bool:
        return self._queue_of(store_queue_name) is not None

    def _on_notify(self, store_queue_name: str, max_offset: int) -> None:
        queue = self._queue_of(store_queue_name)
        if queue is None:
            return
        # (the queue cache heard of the event first, by itself: reads see the new end)
        if queue.definition.max_length is not None:  # (whatever protocol wrote: MQTT through amq.topic too)
            self._bound(queue)
        elif queue.consumers:
            queue.schedule_pump()

    def stored(self, store_queues: set[str]) -> None:
        """A connection's publishes to these store queues are stored: x-max-length applies now,
        before the notify loop runs, so that the publisher's next basic.get (or queue.declare's
        count) sees the bound queue (the queue cache knew their new ends at once)."""
        for name in store_queues:
            queue = self._queue_of(name)
            if queue is not None and queue.definition.max_length is not None:
                self._bound(queue)

    def _bound(self, queue: QueueRuntime) -> None:
        """x-max-length drop-head: the bound is on messages waiting, so consumers with room take
        theirs first."""
        if queue.consumers:
            queue.pump()
        queue.enforce_max_length()

    # -- flow control and housekeeping ---------------------------------------------------------
    @property
    def blocked(self) -> bool:
        """The store's resource alarm is raised: publishing connections are blocked."""
        return self.pressure is not None and self.pressure.raised

    def _resource_alarm(self, reason: str | None) -> None:
        for conn in list(self.connections):
            conn.resource_alarm(reason)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.housekeeping_interval_s)
            try:
                self.sweep(time.monotonic())
            except StoreError as exc:  # (a full disk: tried again next time, logged once a minute)
                self._failures.log(logging.ERROR, type(exc).__name__, "amqp housekeeping not stored error=%s", exc)
            except Exception:
                log.exception("amqp housekeeping failed")

    def sweep(self, now: float) -> None:
        """Delete queues unused for longer than their x-expires, and expire (dead-letter) the
        messages at the head of idle queues whose TTL ran out, as RabbitMQ does without waiting
        for a consumer."""
        for queue in list(self.queues.values()):
            expires = queue.definition.expires_ms
            if expires is not None and not queue.consumers and (now - queue.last_used) * 1000 >= expires:
                log.info("amqp queue expired queue=%s unused_ms=%d", queue.name, int((now - queue.last_used) * 1000))
                self.remove_queue(queue)
                continue
            if not queue.consumers and queue.ready_count():
                queue.expire_head()

    def view(self, message: StoredMessage) -> AMQPView:
        cached = self._views.get(message.position)
        if cached is None:
            cached = self._views[message.position] = AMQPView.of(message)
            if len(self._views) > 8192:
                self._views.popitem(last=False)
        return cached

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
    def _open_queue(self, definition: QueueDefinition, owner: object | None = None, *,
                    restored: bool = False) -> QueueRuntime:
        """A queue at run time: its consumers are a consumer group of the delivery core. A new
        queue starts at its store queue's end (what an earlier queue of the same name left there
        is not its), written through before the queue is declared to anyone: a message confirmed
        a moment later is delivered after any crash. A queue restored at start-up resumes at its
        saved offset (without one, a data dir of an earlier version: at its oldest message)."""
        name = amqp_queue(definition.name)
        start = group_start(self.store, f"amqp:{definition.name}", name, resume=restored, unsaved_at_oldest=True)
        if not restored:
            self.cache.drop(name)
        queue = self.queues[definition.name] = QueueRuntime(self, definition, start, owner, restored=restored)
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
        queue = self._open_queue(definition, conn if m.exclusive else None)
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
        self.store.commit_offset_now(queue.consumer_name, queue.store_queue,
                                     self.store.max_offset_now(queue.store_queue))
        self.cache.drop(queue.store_queue)
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

    # -- the MQTT bridge -----------------------------------------------------------------------
    def amq_topic_queues(self, mqtt_topic: str) -> list[str]:
        """Store queues of the AMQP queues an MQTT publish reaches through amq.topic."""
        names = routed_queues(self.exchanges, "amq.topic", mqtt_topic_to_routing_key(mqtt_topic), None, mqtt=True)
        return [self.queues[name].store_queue for name in sorted(names) if name in self.queues]

    def mqtt_route(self, routing_key: str) -> tuple[str | None, list[str], bool]:
        """The MQTT side of a publish to amq.topic: its MQTT topic (None when the routing key
        cannot be one: '', 'a.#', 'a.+', '$SYS.x', or MQTT is off), the store queues it goes to
        there (the topic's own, matching wildcard and remoting queues, the AMQP queues bound to
        amq.topic), and whether anything besides the topic's own queue takes it: a queue of those
        or a subscriber reading the topic (a mandatory publish no one takes is returned)."""
        if self.mqtt_topics is None:
            return None, [], False
        topic = routing_key_to_mqtt_topic(routing_key)
        if not valid_mqtt_topic(topic):
            return None, [], False
        queues = self.mqtt_topics.queues_for(topic)
        return topic, queues, len(queues) > 1 or self.mqtt_topics.subscribed(topic)

    def _bindings_changed(self, exchange: Exchange) -> None:
        if exchange.name == "amq.topic" and self._amq_topic_changed is not None:
            self._amq_topic_changed()

    # -- publishing ----------------------------------------------------------------------------
    def route(self, exchange_name: str, routing_key: str, headers: dict[str, Any] | None) -> list[QueueRuntime]:
        if exchange_name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        names = routed_queues(self.exchanges, exchange_name, routing_key, headers)
        return [self.queues[name] for name in sorted(names) if name in self.queues]

    def dead_letter(self, queue: QueueRuntime, message: StoredMessage, reason: str) -> None:
        """A rejected, expired or overflowing message goes to the queue's dead-letter exchange."""
        exchange = queue.definition.dead_letter_exchange
        if exchange is None:
            return
        view = self.view(message)
        routing_key = queue.definition.dead_letter_routing_key or view.routing_key
        properties = copy_properties(view.properties)
        properties.headers = record_death(dict(properties.headers or {}), queue.name, reason, view.exchange,
                                          view.routing_key)
        headers = properties.headers
        properties.expiration = None  # the TTL that expired it must not expire the dead letter
        routed = [q for q in self.route(exchange, routing_key, headers) if q is not queue or reason != "expired"]
        targets, places = take_places(routed)  # (a full reject-publish queue drops its copy, as RabbitMQ)
        if not targets:
            return
        stored: Message = decoded_to_store_message(exchange, routing_key, properties, message.body)
        stored.properties = {**(stored.properties or {}), DEATHS: reason}
        try:
            fut = self.store.put_batch_nowait([(stored, [q.store_queue for q in targets])])
        except StoreError as exc:  # (its x-death headers may take it over max_message_size)
            log.error("dead letter not stored queue=%s reason=%s error=%s", queue.name, reason, exc)
            for place in places:
                place.give_place_back()
            return

        def done(f: asyncio.Future) -> None:
            for place in places:
                place.give_place_back()
            if f.cancelled() or f.exception() is not None:
                log.error("dead letter not stored queue=%s error=%s", queue.name,
                          "cancelled" if f.cancelled() else f.exception())
            else:
                self.stored({q.store_queue for q in targets})  # (x-max-length drop-head applies)

        fut.add_done_callback(done)
