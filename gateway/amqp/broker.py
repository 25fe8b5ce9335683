"""The node's AMQP gateway at run time: its connections' settings, the notify listener that wakes
queues with consumers, housekeeping (x-expires, TTL), the MQTT bridge through amq.topic, routing
of publishes and dead-lettering. The exchanges, queues and bindings themselves are declarations.py's."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from pamqp import commands

from cache import QueueCache
from protocols.amqp.frames import copy_properties
from store import Message, MessageStore, StoredMessage, StoreError
from store import RateLimitedLog

from ..auth.authorize import Authorizer
from ..deadlines import Deadlines, StalledReads
from ..interop import (
    AMQP_QUEUE_PREFIX,
    TopicSpace,
    mqtt_topic_to_routing_key,
    routing_key_to_mqtt_topic,
    valid_mqtt_topic,
)
from ..stats import ProtocolStats
from ..tasks import cancel_and_wait
from .declarations import Declarations
from .direct_reply import DirectReplies
from .messages import DEATHS, AMQPView, decoded_to_store_message, record_death
from .model import Exchange, routed_queues
from .queues import QueueRuntime, take_places

if TYPE_CHECKING:
    from ..auth.passwords import PasswordFile
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
        self.declarations = Declarations(self, store.table(META_TABLE))
        # (the declarations' own tables, read here to route and by permissions and the HTTP API)
        self.exchanges: dict[str, Exchange] = self.declarations.exchanges
        self.queues: dict[str, QueueRuntime] = self.declarations.queues
        if mqtt_topics is not None:
            self.declarations.amq_topic_changed = mqtt_topics.join(self.amq_topic_queues)
        self._known_views: dict[tuple[int, str, bytes], AMQPView] = {}  # the messages alike share one
        self._to_flush: set[AMQPConnection] = set()  # connections with deliveries to write (flush_soon)
        self._serving = False  # in _serve_written: it writes the connections itself, at its end
        self._written: dict[QueueRuntime, None] = {}  # queues a commit wrote to, served once it is complete
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False  # between start() and stop(): notify events are acted on

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.declarations.restore()
        self._running = True
        # heard as each commit is published (no task between a commit and the pump it wakes:
        # a delivery goes out in the loop turn that stores its message)
        self.store.listen_notify(self._on_notify)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._housekeeping(), name="amqp-housekeeping"))
        if self.pressure is not None:
            self.pressure.on_change(self._resource_alarm)
        log.info("amqp state restored exchanges=%d queues=%d", len(self.exchanges), len(self.queues))

    async def stop(self) -> None:
        self._running = False
        self.store.unlisten_notify(self._on_notify)
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

    def _on_notify(self, events: dict[str, int]) -> None:
        """A commit's ``{store queue: max offset}``, heard inside the store's dispatch: the
        queues it wrote to are served once the commit is complete, in the committer's turn
        (``_serve_written``), not here."""
        if not self._running:
            return
        written = self._written
        for store_queue_name in events:
            queue = self._queue_of(store_queue_name)
            if queue is not None and (queue.consumers or queue.definition.max_length is not None):
                if not written:
                    self.store.after_commit(self._serve_written)
                written[queue] = None

    def _serve_written(self) -> None:
        """Pump the queues written to (x-max-length ones bounded too) and write their
        connections' deliveries at once: before anything the commit scheduled (the store's
        fdatasync request, the publishers' confirms) takes the CPU."""
        queues, self._written = self._written, {}
        self._serving = True
        try:
            for queue in queues:
                if queue.deleted:
                    continue
                try:
                    # (the queue cache heard of the commit first, by itself: reads see the new end)
                    if queue.definition.max_length is not None:  # (whatever protocol wrote: MQTT through amq.topic too)
                        self._bound(queue)
                    elif queue.consumers:
                        queue.pump()
                except Exception:  # (one queue's failure leaves the others served)
                    log.exception("amqp queue not served queue=%s", queue.name)
        finally:
            self._serving = False
        self._flush()

    def stored(self, store_queues: set[str]) -> None:
        """A connection's publishes to these store queues are stored: x-max-length applies now,
        before the notify listener's turn, so that the publisher's next basic.get (or queue.declare's
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
                self.declarations.remove_queue(queue)
                continue
            if not queue.consumers and queue.ready_count():
                queue.expire_head()

    def flush_soon(self, connection: AMQPConnection) -> None:
        """Write the connection's output once the queues woken together have made their
        deliveries: one write for all its channels' queues, not one a queue (in the turn of a
        commit, at the end of ``_serve_written``; otherwise on the loop's next turn)."""
        if not self._to_flush and not self._serving:
            asyncio.get_running_loop().call_soon(self._flush)
        self._to_flush.add(connection)

    def _flush(self) -> None:
        connections, self._to_flush = self._to_flush, set()
        for connection in connections:
            connection.flush()

    def view(self, message: StoredMessage) -> AMQPView:
        """What an AMQP consumer is told of ``message`` (shared by the messages alike)."""
        return AMQPView.of(message, self._known_views)

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
