"""The remoting node: name-server and broker roles over the unified store.

One node answers route lookups with itself as the only broker, stores sends into its topic
queues (``r:{topic}:{queueId}``), serves pulls from them with long polling, keeps consumer
offsets and groups, and does retries, dead letters and delayed messages as RocketMQ does.
Requests come from ``RemotingConnection``; each handler takes the request and returns the
response (None for one-way requests).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from cache import QueueCache
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.headers import SendMessageHeader, SendMessageResponseHeader
from protocols.remoting.message_codec import WireMessage, offset_msg_id
from protocols.remoting.relay_memory import RELAY_PRODUCER, RELAY_SEQ, SEND_ANSWERS
from protocols.remoting.properties import (
    DELAY,
    SHARDING_KEY,
    UNIQ_KEY,
    decode_batch_body,
)
from store import (
    MessageStore,
    NotLeaderError,
    NotReplicatedError,
    PutResult,
    StoreClosedError,
    StoredMessage,
    StoreError,
    StoreWriteError,
)
from store import InvalidMessageError, Message, MessageTooLargeError
from store import HALF, TIMER
from store import RateLimitedLog

from ..auth.authorize import Principal
from ..core.pop import PopService
from ..deadlines import Deadlines, StalledReads
from ..interop import (
    REMOTING_QUEUE_PREFIX,
    SECOND_TOPIC_PROPERTY,
    TopicSpace,
    mqtt_topic_of,
    remoting_queue,
    remoting_topic_of,
)
from ..stats import ProtocolStats
from ..tasks import cancel_and_wait
from .access import RemotingAccess, Right
from .consumers import ConsumerRequests
from .groups import ConsumerGroups
from .long_poll import PullHolds
from .messages import Origin, client_properties, plain_body, to_store_message, to_wire, with_origin
from .offsets import OffsetRequests
from .ordering import sharding_queue
from .pops import PopRequests, PopWaiters
from .pulls import PullRequests
from .queries import QueryRequests
from .requests import BadRequest, Pending, Reply, str_field
from .retries import RetryRequests
from .schedule import (
    DEFAULT_DELAY_LEVELS,
    ScheduleService,
    parse_delay_levels,
)
from .selectors import Selectors
from .topic_updates import TopicUpdateRequests
from .timers import TIMER_PROPERTIES, timer_due_ms
from .topics import (
    PERM_WRITE,
    TOPICS_TABLE,
    TopicRegistry,
)
from .transactions import Producers, TransactionService, TransactionSettings, is_half

if TYPE_CHECKING:
    from .connection import RemotingConnection

log = logging.getLogger("tidemq.remoting")

DEFAULT_MAX_RECONSUME_TIMES = 16


@dataclass(slots=True)
class Sent:
    """A message handed to the store by ``put_message``: its put, the topic queue it went to
    (``own``, the store queue) and the properties it was stored with."""

    future: asyncio.Future[Sequence[PutResult]]
    queue_id: int
    own: str
    properties: dict[str, str]
    batch: list[tuple[Message, list[str]]]


class RemotingBroker(PullRequests, PopRequests, ConsumerRequests, RetryRequests, QueryRequests,
                     TopicUpdateRequests, OffsetRequests):
    def __init__(self, store: MessageStore, *, cache: QueueCache, broker_addr: str = "127.0.0.1:9876",
                 broker_name: str = "tidemq", cluster: str = "DefaultCluster", default_queues: int = 4,
                 delay_levels: list[float] | None = None, max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                 long_poll_max_s: float = 30.0, access: RemotingAccess | None = None,
                 stats: ProtocolStats | None = None, connect_timeout_s: float = 10.0,
                 mqtt_topics: TopicSpace | None = None, enable_property_filter: bool = True,
                 transactions: TransactionSettings | None = None, idle_timeout_s: float = 120.0,
                 read_timeout_s: float = 60.0) -> None:
        self.store = store
        self.cache = cache
        self.broker_addr = ""
        self.origin = Origin.of("127.0.0.1", 0)
        self.set_address(broker_addr)
        self.broker_name = broker_name
        self.cluster = cluster
        self.max_reconsume_times = max_reconsume_times
        self.long_poll_max_s = long_poll_max_s
        self.limited_log = RateLimitedLog(log)  # what a client can repeat per connection (bad frames)
        self.connect_timeout_s = connect_timeout_s  # a connection's first request comes within this
        self.deadlines = Deadlines()  # the connections' first-request and idle timeouts
        self.idle_timeout_s = idle_timeout_s  # a connection without a request this long is closed (0: never)
        self.stalled = StalledReads(read_timeout_s)  # connections silent in the middle of a frame
        self.topics = TopicRegistry(store.table(TOPICS_TABLE), default_queues=default_queues)
        self.groups = ConsumerGroups()
        self.groups.on_members_changed = self._members_changed
        self.holds = PullHolds()
        self.selectors = Selectors(enable_property_filter=enable_property_filter)  # pull filters (TAG, SQL92)
        self.schedule = ScheduleService(store, delay_levels or parse_delay_levels(DEFAULT_DELAY_LEVELS),
                                        self._deliver_delayed)
        self.stats = stats or ProtocolStats()
        self.access = access or RemotingAccess(stats=self.stats)  # who may do what (access.py)
        self.producers = Producers()  # (live producer connections by group: transaction checks)
        self.transactions = TransactionService(store, self.producers, transactions or TransactionSettings(),
                                               self._half_message, self.access)
        # pop consumption (pops.py): check points in the store, revived by one task
        self.pop = PopService(store, self._pop_dead_letter, lambda group: self.max_reconsume_times)
        self.pop.on_ready = self._pop_ready
        self.pop_waiters = PopWaiters()
        self.connections: set[RemotingConnection] = set()
        # (transport, bytes read, peer): takes a connection that opens with HTTP/2's preface or a
        # TLS handshake instead of a remoting frame (gRPC on this port: gateway/rocketmq_grpc/shared_port.py)
        self.http2_handoff: Callable[[asyncio.Transport, bytes, str], None] | None = None
        # the MQTT side, when MQTT runs: a remoting topic is an MQTT first level (docs/remoting.md)
        self.mqtt_topics = mqtt_topics
        if mqtt_topics is not None:
            topics_changed = mqtt_topics.join(self.topics.queues_for_mqtt)
            self.topics.on_changed.append(lambda name: topics_changed())
        self._tasks: list[asyncio.Task[None]] = []
        self._locks: dict[tuple[str, str, int], tuple[str, float]] = {}  # (group, topic, qid) -> (client, at)
        # whether a connection is a gateway node's (its relay's numbered sends are taken): the
        # store link's say, on a store node; none elsewhere
        self.relay_trusted: Callable[[RemotingConnection], bool] = lambda conn: False
        self.handlers: dict[int, Callable[[RemotingConnection, RemotingCommand], Any]] = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route_info,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_topic_list,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_batch,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_store_time,
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
            RequestCode.END_TRANSACTION: self.transactions.end,
            RequestCode.POP_MESSAGE: self.pop_message,
            RequestCode.ACK_MESSAGE: self.ack_message,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack_message,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
        }

    def set_address(self, addr: str) -> None:
        """The HOST:PORT clients reach this broker at: route data names it, and pulled messages
        carry it as their store host (clients send CONSUMER_SEND_MSG_BACK there)."""
        host, _, port = addr.rpartition(":")
        self.broker_addr = addr
        self.origin = Origin.of(host, int(port))

    def msg_id(self, position: int) -> str:
        """RocketMQ's offsetMsgId of a stored message: this broker's address and its position."""
        return offset_msg_id(self.origin.host, self.origin.port, position)

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        notify = self.store.subscribe_notify()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(notify.feed(self._on_notify), name="remoting-notify"))
        self._tasks.append(loop.create_task(self._expire_members(), name="remoting-groups"))
        self.schedule.start()
        self.transactions.start()
        self.pop.start()
        log.info("remoting state restored topics=%d", len(self.topics.topics))

    async def stop(self) -> None:
        self.holds.wake_all()
        self.pop_waiters.wake_all()
        for conn in list(self.connections):
            conn.close()
        await self.schedule.stop()
        await self.transactions.stop()
        await self.pop.stop()
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        self.deadlines.close()
        self.stalled.close()

    def _on_notify(self, store_queue_name: str, max_offset: int) -> None:
        if store_queue_name.startswith(REMOTING_QUEUE_PREFIX):
            self.holds.on_notify(store_queue_name, max_offset)
            self.pop_waiters.wake(store_queue_name)
        else:
            self.schedule.on_notify(store_queue_name)

    async def _expire_members(self) -> None:
        while True:
            await asyncio.sleep(10.0)
            self.groups.expire()
            now = time.monotonic()
            for key, (_, at) in list(self._locks.items()):
                if now - at > 60.0:
                    del self._locks[key]

    # -- dispatch ------------------------------------------------------------------------------
    def dispatch(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        """The reply to ``request``: a response, None (one-way), a ``Pending`` store write whose
        completion makes the response, or a coroutine to run (a long-polled pull)."""
        producer: tuple[bytes, int] | None = None
        if RELAY_PRODUCER in request.ext_fields:  # (before the signature check: it does not cover them)
            numbered = self._numbered_by_relay(conn, request)
            if isinstance(numbered, RemotingCommand):
                return numbered
            producer = numbered
        refusal = self.access.authenticate(conn, request)  # sets conn.principal
        if refusal is not None:
            return refusal
        handler = self.handlers.get(request.code)
        if handler is None:
            return response_to(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               f"request code {request.code} is not supported by TideMQ")
        meta_before = self.store.meta_position
        try:
            self.access.check_request(conn.principal, request)  # what the request code needs (access.py)
            conn.put_producer = producer  # (for this request's put only)
            reply = handler(conn, request)
        except Exception as exc:
            return self.error_response(request, exc)
        finally:
            conn.put_producer = None
        if isinstance(reply, RemotingCommand):  # (a put's Pending comes after the meta changes in the log)
            # (reads go on while too few replicas are in sync to acknowledge anything)
            settling = self.store.reply_settling(meta_before)
            if settling is not None:  # a replicated store: answered once the in-sync replicas hold them
                return self._after_meta(request, settling, reply)
        elif asyncio.iscoroutine(reply):  # (a held pull or pop, an END_TRANSACTION: their changes too)
            return self._settled_after(request, reply, meta_before)
        return reply

    def _numbered_by_relay(self, conn: RemotingConnection, request: RemotingCommand
                           ) -> tuple[bytes, int] | RemotingCommand:
        """A send a gateway node's relay numbered (it may send it again to this store after
        losing the answer): the number, taken off the request, for the store's idempotent put;
        NO_PERMISSION from a connection that is no gateway node's."""
        producer = request.ext_fields.pop(RELAY_PRODUCER, "")
        seq = request.ext_fields.pop(RELAY_SEQ, "")
        if not self.relay_trusted(conn):
            return response_to(request, ResponseCode.NO_PERMISSION, "numbered sends are for gateway nodes' relays "
                               "(say HELLO with the cluster token first)")
        if request.code not in SEND_ANSWERS or not seq.isdigit():
            return response_to(request, ResponseCode.SYSTEM_ERROR, "a relay's number on a request that is no send, "
                               "or not a number")
        return producer.encode(), int(seq)

    async def _settled_after(self, request: RemotingCommand, reply: Coroutine[Any, Any, RemotingCommand | None],
                             meta_before: int) -> RemotingCommand | None:
        """A coroutine's reply, once the meta changes made before it are held as the store promises."""
        response = await reply
        if response is None:
            return None
        settling = self.store.reply_settling(meta_before)
        return response if settling is None else await self._after_meta(request, settling, response)

    async def _after_meta(self, request: RemotingCommand, settling: asyncio.Future[None],
                          reply: RemotingCommand) -> RemotingCommand:
        """``reply``, once the meta changes made before it (a topic, an offset, a session) are
        held as the store promises; the store's error instead when they are not."""
        try:
            await settling
        except StoreError as exc:
            return self.error_response(request, exc)
        return reply

    def error_response(self, request: RemotingCommand, exc: BaseException) -> RemotingCommand:
        if isinstance(exc, BadRequest):
            return response_to(request, exc.code, str(exc))
        if isinstance(exc, RemotingProtocolError):
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"bad request: {exc}")
        if isinstance(exc, (MessageTooLargeError, InvalidMessageError)):
            return response_to(request, ResponseCode.MESSAGE_ILLEGAL, str(exc))
        if isinstance(exc, StoreError):  # (a full disk fails every send: logged once a minute)
            self.limited_log.log(logging.ERROR, type(exc).__name__, "remoting store error code=%d error=%s",
                                 request.code, exc)
            # (as RocketMQ's broker answers when its store is not writeable: a full disk, a
            # failed flush, a replica that no longer leads or too few in sync; its clients retry)
            code = ResponseCode.SERVICE_NOT_AVAILABLE if isinstance(exc, (StoreWriteError, StoreClosedError,
                                                                           NotLeaderError, NotReplicatedError)) \
                else ResponseCode.SYSTEM_ERROR
            return response_to(request, code, f"store error: {exc}")
        log.error("remoting request failed code=%d", request.code, exc_info=exc)
        return response_to(request, ResponseCode.SYSTEM_ERROR, "internal error")

    async def handle(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        """``dispatch`` awaited to its response (for callers that do not batch)."""
        reply = self.dispatch(conn, request)
        try:
            if isinstance(reply, Pending):
                return reply.respond(await reply.future)
            if asyncio.iscoroutine(reply):
                return await reply
        except Exception as exc:
            return self.error_response(request, exc)
        return reply

    # -- name server role ----------------------------------------------------------------------
    def route_data(self, topic: str) -> dict[str, Any]:
        config = self.topics.ensure(topic)
        return {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": self.broker_name, "readQueueNums": config.read_queues,
                            "writeQueueNums": config.write_queues, "perm": config.perm, "topicSysFlag": 0}],
            "brokerDatas": [{"cluster": self.cluster, "brokerName": self.broker_name,
                             "brokerAddrs": {"0": self.broker_addr}}],
            "filterServerTable": {},
        }

    def get_route_info(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        topic = str_field(request.ext_fields, "topic")
        try:
            data = self.route_data(topic)
        except ValueError as exc:
            return response_to(request, ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic} ({exc})")
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(data).encode())

    def get_cluster_info(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        body = {
            "brokerAddrTable": {self.broker_name: {"cluster": self.cluster, "brokerName": self.broker_name,
                                                   "brokerAddrs": {"0": self.broker_addr}}},
            "clusterAddrTable": {self.cluster: [self.broker_name]},
        }
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def get_topic_list(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        body = {"topicList": sorted(name for name in self.topics.topics
                                    if self.access.may_use(conn.principal, name, Right.USE))}
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    # -- sending -------------------------------------------------------------------------------
    def _writable(self, topic: str, queue_id: int, default_queues: int = 0, sharding_key: str | None = None) -> int:
        """The queue id a send goes to (validated; by its sharding key when it has one:
        ordering.py), creating the topic when new."""
        try:
            config = self.topics.ensure(topic, default_queues or None)
        except ValueError as exc:
            raise BadRequest(str(exc), ResponseCode.MESSAGE_ILLEGAL) from None
        if not config.perm & PERM_WRITE:
            raise BadRequest(f"the topic {topic} is not writable", ResponseCode.NO_PERMISSION)
        if sharding_key:
            return sharding_queue(sharding_key, config.write_queues)
        if queue_id < 0 or queue_id >= config.write_queues:
            queue_id = queue_id % config.write_queues if queue_id >= 0 else 0
        return queue_id

    def targets(self, topic: str, queue_id: int, properties: dict[str, str]) -> list[str]:
        """Store queues a remoting message goes to: its topic queue and, through the MQTT
        mapping, the MQTT topic queue (and wildcard and bridged queues) of its topic."""
        own = remoting_queue(topic, queue_id)
        targets = [own]
        if self.mqtt_topics is not None:
            mqtt_topic = mqtt_topic_of(topic, properties.get(SECOND_TOPIC_PROPERTY))
            if mqtt_topic is not None:
                targets.extend(q for q in self.mqtt_topics.queues_for(mqtt_topic)
                               if not q.startswith(REMOTING_QUEUE_PREFIX))
        return targets

    def _half_message(self, message: StoredMessage, queue: str) -> tuple[WireMessage, str]:
        """A half message as a transaction check carries it (transactions.py), its offsetMsgId."""
        topic, queue_id = remoting_topic_of(queue) or (message.topic, 0)
        return to_wire(message, topic, queue_id, self.origin, half=True), self.msg_id(message.position)

    def _record_topic(self, topic: str, properties: dict[str, str]) -> str:
        return mqtt_topic_of(topic, properties.get(SECOND_TOPIC_PROPERTY)) or topic

    def send_message(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        header = SendMessageHeader.from_ext_fields(request.code, request.ext_fields)
        if header.batch:
            return self.send_batch(conn, request, header)
        body, sys_flag = plain_body(request.body, header.sys_flag, self.store.options.max_message_size)
        sent = self.put_message(conn.principal, header.topic, body, client_properties(header.properties),
                                queue_id=header.queue_id, default_queues=header.default_topic_queue_nums,
                                flag=header.flag, sys_flag=sys_flag, born_timestamp=header.born_timestamp,
                                born_host=conn.peer, reconsume_times=header.reconsume_times or 0,
                                max_reconsume=header.max_reconsume_times, producer=conn.put_producer)
        if conn.tracer is not None:
            conn.tracer.watch_put("remoting", conn.client_id or conn.peer, sent.batch, sent.future)

        def respond(results: Sequence[PutResult]) -> RemotingCommand | None:
            if request.is_oneway:
                return None
            return response_to(request, ResponseCode.SUCCESS, ext_fields=SendMessageResponseHeader(
                self.msg_id(results[0].position), sent.queue_id, results[0].queue_offsets.get(sent.own, -1),
                transaction_id=sent.properties.get(UNIQ_KEY)).to_ext_fields())
        return Pending(sent.future, respond)

    def put_message(self, who: Principal, topic: str, body: bytes, properties: dict[str, str], *, queue_id: int,
                    default_queues: int = 0, flag: int = 0, sys_flag: int = 0, born_timestamp: int = 0,
                    born_host: str = "", reconsume_times: int = 0, max_reconsume: int | None = None,
                    producer: tuple[bytes, int] | None = None) -> Sent:
        """Store one message sent to remoting topic ``topic`` (by a remoting or gRPC client):
        the sender's rights, the topic's queue (created when new), retries, delay levels, timers
        and transactions' half messages as RocketMQ's broker does; ``producer``: an idempotent
        put's number (store/write/idempotence.py). Raises BadRequest."""
        self.access.check_send(who, topic, properties)  # (before the topic is created)
        properties = with_origin(topic, properties)
        queue_id = self._writable(topic, queue_id, default_queues, properties.get(SHARDING_KEY))
        max_reconsume = max_reconsume if max_reconsume is not None else self.max_reconsume_times
        record_topic, queue_id, properties, targets, level_due = self._placement(
            topic, queue_id, properties, reconsume_times, max_reconsume)
        now = int(time.time() * 1000)
        half = is_half(properties, sys_flag)
        if half and level_due is not None:
            raise BadRequest("a transaction's half message cannot have a delay level", ResponseCode.MESSAGE_ILLEGAL)
        due = timer_due_ms(properties, now) if not half else self.transactions.first_check_ms(properties, now)
        due = level_due if level_due is not None else due
        message = to_store_message(record_topic, body, properties, flag=flag, sys_flag=sys_flag,
                                   born_timestamp=born_timestamp or now, born_host=born_host,
                                   reconsume_times=reconsume_times)
        if due is not None:  # held in the store: until then (timers.py), or its transaction's end
            message.hold_kind, message.hold_due_ms = HALF if half else TIMER, due
        batch = [(message, targets)]
        self.stats.messages_received += 1
        return Sent(self.store.put_batch_nowait(batch, producer=producer), queue_id, targets[0], properties, batch)

    def send_batch(self, conn: RemotingConnection, request: RemotingCommand,
                         header: SendMessageHeader | None = None) -> Reply:
        header = header or SendMessageHeader.from_ext_fields(request.code, request.ext_fields)
        if header.topic.startswith("%RETRY%"):
            raise BadRequest("batch messages cannot be sent to a retry topic", ResponseCode.MESSAGE_ILLEGAL)
        items = decode_batch_body(request.body)
        if not items:
            raise BadRequest("the batch is empty", ResponseCode.MESSAGE_ILLEGAL)
        item_properties = [client_properties(item.properties) for item in items]
        keys = {properties.get(SHARDING_KEY) for properties in item_properties}
        if len(keys) > 1:
            raise BadRequest("a batch goes to one queue: its messages need one sharding key (__SHARDINGKEY) or none",
                             ResponseCode.MESSAGE_ILLEGAL)
        for properties in item_properties:  # (before the topic is created)
            self.access.check_send(conn.principal, header.topic, properties)
        item_properties = [with_origin(header.topic, properties) for properties in item_properties]
        queue_id = self._writable(header.topic, header.queue_id, header.default_topic_queue_nums, keys.pop())
        born = header.born_timestamp or int(time.time() * 1000)
        batch = []
        for item, properties in zip(items, item_properties):
            if DELAY in properties or any(name in properties for name in TIMER_PROPERTIES):
                raise BadRequest("batch messages cannot be delayed", ResponseCode.MESSAGE_ILLEGAL)
            if is_half(properties, header.sys_flag):
                raise BadRequest("batch messages cannot be transactional", ResponseCode.MESSAGE_ILLEGAL)
            message = to_store_message(self._record_topic(header.topic, properties), item.body, properties,
                                       flag=item.flag, sys_flag=header.sys_flag, born_timestamp=born,
                                       born_host=conn.peer)
            batch.append((message, self.targets(header.topic, queue_id, properties)))
        own = remoting_queue(header.topic, queue_id)
        self.stats.messages_received += len(batch)

        def respond(results: Sequence[PutResult]) -> RemotingCommand | None:
            if request.is_oneway:
                return None
            return response_to(request, ResponseCode.SUCCESS, ext_fields=SendMessageResponseHeader(
                ",".join(self.msg_id(r.position) for r in results), queue_id,
                results[0].queue_offsets[own]).to_ext_fields())
        future = self.store.put_batch_nowait(batch, producer=conn.put_producer)
        if conn.tracer is not None:
            conn.tracer.watch_put("remoting", conn.client_id or conn.peer, batch, future)
        return Pending(future, respond)
