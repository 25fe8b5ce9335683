"""The remoting node: name-server and broker roles over the unified store.

One node answers route lookups with itself as the only broker, stores sends into its topic
queues (``r:{topic}:{queueId}``), serves pulls from them with long polling, keeps consumer
offsets and groups, and does retries, dead letters and delayed messages as RocketMQ does.
Requests come from ``Client``; each handler takes the request and returns the
response (None for one-way requests).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from cache import QueueCache
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.headers import (
    PullMessageHeader,
    SendMessageHeader,
    SendMessageResponseHeader,
)
from protocols.remoting.message_codec import encode_message, offset_msg_id
from protocols.remoting.properties import (
    DELAY,
    UNIQ_KEY,
    decode_batch_body,
    decode_properties,
)
from protocols.remoting.tags import subscription_codes
from store import GetStatus, MessageStore, PutResult, StoreError
from store.errors import InvalidMessageError, MessageTooLargeError
from store.log_limit import RateLimitedLog

from ..deadlines import Deadlines
from ..interop import REMOTING_QUEUE_PREFIX, SECOND_TOPIC_PROPERTY, TopicSpace, mqtt_topic_of, remoting_queue
from ..stats import ProtocolStats
from ..tasks import cancel_and_wait
from .access import RemotingAccess
from .consumers import ConsumerRequests
from .groups import ConsumerGroups
from .long_poll import PullHolds
from .messages import Origin, plain_body, to_store_message, to_wire
from .queries import QueryRequests
from .requests import CONSUMER_PREFIX, BadRequest, Client, Pending, Reply, int_field, str_field
from .retries import RetryRequests
from .schedule import (
    DEFAULT_DELAY_LEVELS,
    ScheduleService,
    parse_delay_levels,
)
from .topics import (
    PERM_READ,
    PERM_WRITE,
    TOPICS_TABLE,
    TopicRegistry,
)

log = logging.getLogger("tidemq.remoting")

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
MAX_PULL_MESSAGES = 64
MAX_PULL_BYTES = 4 << 20
DEFAULT_MAX_RECONSUME_TIMES = 16


class RemotingBroker(ConsumerRequests, RetryRequests, QueryRequests):
    def __init__(self, store: MessageStore, *, cache: QueueCache, broker_addr: str = "127.0.0.1:9876",
                 broker_name: str = "tidemq", cluster: str = "DefaultCluster", default_queues: int = 4,
                 delay_levels: list[float] | None = None, max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
                 long_poll_max_s: float = 30.0, access: RemotingAccess | None = None,
                 stats: ProtocolStats | None = None, connect_timeout_s: float = 10.0,
                 mqtt_topics: TopicSpace | None = None) -> None:
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
        self.deadlines = Deadlines()  # the connections' first-request timeouts
        self.topics = TopicRegistry(store.table(TOPICS_TABLE), default_queues=default_queues)
        self.groups = ConsumerGroups()
        self.groups.on_members_changed = self._members_changed
        self.holds = PullHolds()
        self.schedule = ScheduleService(store, delay_levels or parse_delay_levels(DEFAULT_DELAY_LEVELS),
                                        self._deliver_delayed)
        self.connections: set[Client] = set()
        self.stats = stats or ProtocolStats()
        self.access = access or RemotingAccess(stats=self.stats)  # who may do what (access.py)
        # the MQTT side, when MQTT runs: a remoting topic is an MQTT first level (README)
        self.mqtt_topics = mqtt_topics
        if mqtt_topics is not None:
            topics_changed = mqtt_topics.join(self.topics.queues_for_mqtt)
            self.topics.on_created.append(lambda name: topics_changed())
        self._tasks: list[asyncio.Task[None]] = []
        self._locks: dict[tuple[str, str, int], tuple[str, float]] = {}  # (group, topic, qid) -> (client, at)
        self.handlers: dict[int, Callable[[Client, RemotingCommand], Any]] = {
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
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
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
        log.info("remoting state restored topics=%d", len(self.topics.topics))

    async def stop(self) -> None:
        self.holds.wake_all()
        for conn in list(self.connections):
            conn.close()
        await self.schedule.stop()
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        self.deadlines.close()

    def _on_notify(self, store_queue_name: str, max_offset: int) -> None:
        if store_queue_name.startswith(REMOTING_QUEUE_PREFIX):
            self.holds.on_notify(store_queue_name, max_offset)
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
    def dispatch(self, conn: Client, request: RemotingCommand) -> Reply:
        """The reply to ``request``: a response, None (one-way), a ``Pending`` store write whose
        completion makes the response, or a coroutine to run (a long-polled pull)."""
        refusal = self.access.authenticate(conn, request)  # sets conn.principal
        if refusal is not None:
            return refusal
        handler = self.handlers.get(request.code)
        if handler is None:
            return response_to(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               f"request code {request.code} is not supported by TideMQ")
        try:
            return handler(conn, request)
        except Exception as exc:
            return self.error_response(request, exc)

    def error_response(self, request: RemotingCommand, exc: BaseException) -> RemotingCommand:
        if isinstance(exc, BadRequest):
            return response_to(request, exc.code, str(exc))
        if isinstance(exc, RemotingProtocolError):
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"bad request: {exc}")
        if isinstance(exc, (MessageTooLargeError, InvalidMessageError)):
            return response_to(request, ResponseCode.MESSAGE_ILLEGAL, str(exc))
        if isinstance(exc, StoreError):
            log.error("remoting store error code=%d error=%s", request.code, exc)
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"store error: {exc}")
        log.error("remoting request failed code=%d", request.code, exc_info=exc)
        return response_to(request, ResponseCode.SYSTEM_ERROR, "internal error")

    async def handle(self, conn: Client, request: RemotingCommand) -> RemotingCommand | None:
        """``dispatch`` awaited to its response (for callers that do not batch)."""
        reply = self.dispatch(conn, request)
        try:
            if isinstance(reply, Pending):
                return reply.respond(await reply.future)
            if asyncio.iscoroutine(reply):
                return await reply
        except Exception as exc:
            return self.error_response(request, exc)
        return reply  # type: ignore[return-value]

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

    def get_route_info(self, conn, request: RemotingCommand) -> RemotingCommand:
        topic = str_field(request.ext_fields, "topic")
        try:
            data = self.route_data(topic)
        except ValueError as exc:
            return response_to(request, ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic} ({exc})")
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(data).encode())

    def get_cluster_info(self, conn, request: RemotingCommand) -> RemotingCommand:
        body = {
            "brokerAddrTable": {self.broker_name: {"cluster": self.cluster, "brokerName": self.broker_name,
                                                   "brokerAddrs": {"0": self.broker_addr}}},
            "clusterAddrTable": {self.cluster: [self.broker_name]},
        }
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def get_topic_list(self, conn, request: RemotingCommand) -> RemotingCommand:
        body = {"topicList": sorted(self.topics.topics)}
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps(body).encode())

    def create_topic(self, conn, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        topic = str_field(ext, "topic")
        try:
            self.topics.ensure(topic, int_field(ext, "writeQueueNums", 0) or int_field(ext, "readQueueNums", 0))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return response_to(request, ResponseCode.SUCCESS)

    # -- sending -------------------------------------------------------------------------------
    def _writable(self, topic: str, queue_id: int, default_queues: int = 0) -> int:
        """The queue id a send goes to (validated), creating the topic when new."""
        try:
            config = self.topics.ensure(topic, default_queues or None)
        except ValueError as exc:
            raise BadRequest(str(exc), ResponseCode.MESSAGE_ILLEGAL) from None
        if not config.perm & PERM_WRITE:
            raise BadRequest(f"the topic {topic} is not writable", ResponseCode.NO_PERMISSION)
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

    def _record_topic(self, topic: str, properties: dict[str, str]) -> str:
        return mqtt_topic_of(topic, properties.get(SECOND_TOPIC_PROPERTY)) or topic

    def send_message(self, conn: Client, request: RemotingCommand) -> Reply:
        header = SendMessageHeader.from_ext_fields(request.code, request.ext_fields)
        if header.batch:
            return self.send_batch(conn, request, header)
        queue_id = self._writable(header.topic, header.queue_id, header.default_topic_queue_nums)
        properties = decode_properties(header.properties or "")
        self.access.check_send(conn.principal, header.topic, properties, header.sys_flag)
        max_reconsume = header.max_reconsume_times if header.max_reconsume_times is not None \
            else self.max_reconsume_times
        record_topic, queue_id, properties, targets = self._placement(
            header.topic, queue_id, properties, header.reconsume_times or 0, max_reconsume)
        body, sys_flag = plain_body(request.body, header.sys_flag, self.store.options.max_message_size)
        message = to_store_message(record_topic, body, properties, flag=header.flag, sys_flag=sys_flag,
                                   born_timestamp=header.born_timestamp or int(time.time() * 1000),
                                   born_host=conn.peer, reconsume_times=header.reconsume_times or 0)
        future = self.store.put_batch_nowait([(message, targets)])
        if conn.tracer is not None:
            conn.tracer.watch_put("remoting", conn.client_id or conn.peer, [(message, targets)], future)
        self.stats.messages_received += 1
        own = targets[0]

        def respond(results: list[PutResult]) -> RemotingCommand | None:
            if request.is_oneway:
                return None
            return response_to(request, ResponseCode.SUCCESS, ext_fields=SendMessageResponseHeader(
                self.msg_id(results[0].position), queue_id, results[0].queue_offsets[own],
                transaction_id=properties.get(UNIQ_KEY)).to_ext_fields())
        return Pending(future, respond)

    def send_batch(self, conn: Client, request: RemotingCommand,
                         header: SendMessageHeader | None = None) -> Reply:
        header = header or SendMessageHeader.from_ext_fields(request.code, request.ext_fields)
        if header.topic.startswith("%RETRY%"):
            raise BadRequest("batch messages cannot be sent to a retry topic", ResponseCode.MESSAGE_ILLEGAL)
        queue_id = self._writable(header.topic, header.queue_id, header.default_topic_queue_nums)
        items = decode_batch_body(request.body)
        if not items:
            raise BadRequest("the batch is empty", ResponseCode.MESSAGE_ILLEGAL)
        born = header.born_timestamp or int(time.time() * 1000)
        batch = []
        for item in items:
            properties = decode_properties(item.properties or "")
            if DELAY in properties:
                raise BadRequest("batch messages cannot be delayed", ResponseCode.MESSAGE_ILLEGAL)
            self.access.check_send(conn.principal, header.topic, properties, header.sys_flag)
            message = to_store_message(self._record_topic(header.topic, properties), item.body, properties,
                                       flag=item.flag, sys_flag=header.sys_flag, born_timestamp=born,
                                       born_host=conn.peer)
            batch.append((message, self.targets(header.topic, queue_id, properties)))
        own = remoting_queue(header.topic, queue_id)
        self.stats.messages_received += len(batch)

        def respond(results: list[PutResult]) -> RemotingCommand | None:
            if request.is_oneway:
                return None
            return response_to(request, ResponseCode.SUCCESS, ext_fields=SendMessageResponseHeader(
                ",".join(self.msg_id(r.position) for r in results), queue_id,
                results[0].queue_offsets[own]).to_ext_fields())
        future = self.store.put_batch_nowait(batch)
        if conn.tracer is not None:
            conn.tracer.watch_put("remoting", conn.client_id or conn.peer, batch, future)
        return Pending(future, respond)

    # -- pulling -------------------------------------------------------------------------------
    def _readable(self, topic: str, queue_id: int) -> str:
        config = self.topics.get(topic)
        if config is None:
            raise BadRequest(f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST)
        if not config.perm & PERM_READ:
            raise BadRequest(f"the topic {topic} is not readable", ResponseCode.NO_PERMISSION)
        if queue_id < 0 or queue_id >= config.read_queues:
            raise BadRequest(f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                             f"[{config.read_queues}]")
        return remoting_queue(topic, queue_id)

    def _read(self, queue: str, offset: int, max_messages: int, tags: frozenset[int] | None):
        if tags is None:
            return self.cache.read(queue, offset, max_messages, MAX_PULL_BYTES)
        return self.store.get_now(queue, offset, max_messages, MAX_PULL_BYTES, tag_hashes=tags)

    def pull_message(self, conn: Client, request: RemotingCommand) -> Reply:
        """Answered at once when there is data (or no suspend asked); else a coroutine that
        holds the pull until the store's notify or its timeout."""
        header = PullMessageHeader.from_ext_fields(request.ext_fields)
        queue = self._readable(header.topic, header.queue_id)
        reads = self.access.read_filter(conn.principal, header.topic)  # None: every message may be read
        if header.sys_flag & FLAG_SUBSCRIPTION or header.subscription:
            expression = header.subscription
        else:
            sub = self.groups.subscription(header.consumer_group, header.topic)
            expression = sub.expression if sub is not None else "*"
        if header.expression_type not in (None, "", "TAG"):
            raise BadRequest(f"expression type {header.expression_type} is not supported (TAG only)",
                             ResponseCode.SUBSCRIPTION_PARSE_FAILED)
        tags = subscription_codes(expression)
        if header.sys_flag & FLAG_COMMIT_OFFSET and header.commit_offset is not None and header.commit_offset >= 0:
            self.store.commit_offset_now(CONSUMER_PREFIX + header.consumer_group, queue, header.commit_offset)
        max_messages = max(1, min(header.max_msg_nums or 32, MAX_PULL_MESSAGES))
        offset = header.queue_offset
        result = self._read(queue, offset, max_messages, tags)
        if (result.status in (GetStatus.NO_NEW_MESSAGE, GetStatus.NO_SUCH_QUEUE)
                and header.sys_flag & FLAG_SUSPEND and header.suspend_timeout_millis):
            timeout = min(header.suspend_timeout_millis / 1000, self.long_poll_max_s)
            return self._held_pull(conn, request, header, queue, offset, max_messages, tags, timeout, result, reads)
        return self._pull_response(conn, request, result, offset, header, reads)

    async def _held_pull(self, conn: Client, request: RemotingCommand, header: PullMessageHeader,
                         queue: str, offset: int, max_messages: int, tags: frozenset[int] | None, timeout: float,
                         result, reads) -> RemotingCommand:
        if await self.holds.wait(queue, offset, timeout):
            result = self._read(queue, offset, max_messages, tags)
        return self._pull_response(conn, request, result, offset, header, reads)

    def _pull_response(self, conn: Client, request: RemotingCommand, result, offset: int,
                       header: PullMessageHeader, reads=None) -> RemotingCommand:
        topic, queue_id = header.topic, header.queue_id
        status = result.status
        ext = {"suggestWhichBrokerId": "0", "minOffset": str(result.min_offset),
               "maxOffset": str(result.max_offset)}
        messages = result.messages if reads is None or status is not GetStatus.FOUND else \
            [m for m in result.messages if reads(m)]  # (the ACL skips the others, as MQTT's deliveries)
        if status is GetStatus.FOUND and messages:
            self.stats.messages_sent += len(messages)
            if conn.tracer is not None:  # (a pull consumer acknowledges by offset: no ack events)
                client = f"{header.consumer_group}@{conn.client_id or conn.peer}"
                for m in messages:
                    conn.tracer.delivered("remoting", client, m.position, m.queue, m.queue_offset, 1)
            body = b"".join(encode_message(to_wire(m, topic, queue_id, self.origin)) for m in messages)
            ext["nextBeginOffset"] = str(result.next_offset)
            return response_to(request, ResponseCode.SUCCESS, ext_fields=ext, body=body)
        if status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.FOUND):
            ext["nextBeginOffset"] = str(result.next_offset)
            return response_to(request, ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", ext_fields=ext)
        if status is GetStatus.NO_SUCH_QUEUE:
            ext.update(nextBeginOffset="0", minOffset="0", maxOffset="0")
            return response_to(request, ResponseCode.PULL_NOT_FOUND, "no message in queue", ext_fields=ext)
        if status is GetStatus.NO_NEW_MESSAGE:
            ext["nextBeginOffset"] = str(offset)
            return response_to(request, ResponseCode.PULL_NOT_FOUND, "no new message", ext_fields=ext)
        # OFFSET_TOO_SMALL / OFFSET_OVERFLOW: the consumer is told where the queue is now
        ext["nextBeginOffset"] = str(result.next_offset)
        return response_to(request, ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is out of range",
                           ext_fields=ext)

    # -- offsets -------------------------------------------------------------------------------
    def _queue_of(self, ext: dict[str, str]) -> tuple[str, str]:
        topic = str_field(ext, "topic")
        return topic, remoting_queue(topic, int_field(ext, "queueId"))

    def query_consumer_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group = str_field(ext, "consumerGroup")
        _, queue = self._queue_of(ext)
        offset = self.store.get_offset_now(CONSUMER_PREFIX + group, queue)
        if offset is None:
            # As RocketMQ's broker: a group new to a queue whose first message is still there
            # starts from 0 (so messages sent before the first consumer started are consumed);
            # otherwise the client's consumeFromWhere decides.
            if self.store.max_offset_now(queue) == 0 or self._min_offset(queue) > 0:
                return response_to(request, ResponseCode.QUERY_NOT_FOUND,
                                   "Not found, maybe this group consumer boot first")
            offset = 0
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def _min_offset(self, queue: str) -> int:
        result = self.store.get_now(queue, -1, 1)
        return result.min_offset

    def update_consumer_offset(self, conn, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        group = str_field(ext, "consumerGroup")
        _, queue = self._queue_of(ext)
        offset = int_field(ext, "commitOffset")
        if offset >= 0:  # clients report -1 for queues they hold no position in: nothing to keep
            self.store.commit_offset_now(CONSUMER_PREFIX + group, queue, offset)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def get_max_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(self.store.max_offset_now(queue))})

    def get_min_offset(self, conn, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(self._min_offset(queue))})

    async def search_offset_by_timestamp(self, conn, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        _, queue = self._queue_of(ext)
        offset = await self.store.offset_for_timestamp(queue, int_field(ext, "timestamp"))
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def get_earliest_store_time(self, conn, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        first = self.store.get_now(queue, self._min_offset(queue), 1)
        if first.status is not GetStatus.FOUND:
            return response_to(request, ResponseCode.SYSTEM_ERROR, "the queue has no message")
        return response_to(request, ResponseCode.SUCCESS,
                           ext_fields={"timestamp": str(first.messages[0].store_timestamp)})

