"""POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME as RocketMQ 5's
broker answers them (PopMessageProcessor, AckMessageProcessor, ChangeInvisibleTimeProcessor),
over the gateway's pop service (core/pop.py). Mixed into ``RemotingBroker``.

A pop answers with the messages (the pull layout) and a PopMessageResponseHeader: popTime,
invisibleTime, reviveQid, restNum, and per queue ``startOffsetInfo`` / ``msgOffsetInfo``, from
which the client builds each message's extraInfo (ExtraInfoUtil: ckQueueOffset popTime
invisibleTime reviveQid retry brokerName queueId queueOffset) and echoes it in its ack. The
pop time and invisible time there name the check point (it is due at their sum). A revived
message comes back from its own queue with its reconsume count + 1 (no retry topic: the
retry flag is always 0); orderly pop (``order=true``) is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import asyncio
import base64
import functools
import itertools
import json
import re
from dataclasses import dataclass

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.headers import get_bool
from protocols.remoting.message_codec import encode_message
from protocols.remoting.properties import ORIGIN_MESSAGE_ID, RETRY_TOPIC
from store import StoredMessage, now_ms
from store import CheckPoint

from ..core.pop import Popped
from ..core.pop_order import Ordered
from ..interop import remoting_queue, remoting_topic_of
from .access import Right
from .broker_parts import BrokerParts
from .messages import ORIGIN_TOPIC_PROPERTY, RECONSUME_PROPERTY, origin_topic, restore, to_wire, user_properties
from .pulls import PERM_READ
from .requests import CONSUMER_PREFIX, BadRequest, Reply, int_field, str_field
from .topics import dlq_topic

if TYPE_CHECKING:
    from ..auth.authorize import Principal
    from .connection import RemotingConnection
    from .selectors import Selector

MAX_POP_MESSAGES = 32  # RocketMQ's broker refuses more
MAX_GROUP_CHARS = 255
MAX_BIT_SET_BYTES = 1 << 20  # a batch ack's bit set: offsets up to 8 M past its pop's start
MAX_BATCH_ACK_BITS = 1024  # and set bits (one pop's messages of one queue: at most 32)
_SET_BYTES = re.compile(rb"[^\x00]")
NORMAL = "0"  # ExtraInfoUtil's retry flag of a message from its own topic
VALUE_LIMIT = (1 << 62) - 1  # times and offsets beyond: refused (their sum is a key's u64)


def _group(name: str) -> str:
    """A consumer group name, bounded as RocketMQ's Validators bound names (255 characters)."""
    if len(name) > MAX_GROUP_CHARS:
        raise BadRequest(f"the consumer group name is longer than {MAX_GROUP_CHARS} characters",
                         ResponseCode.INVALID_PARAMETER)
    return name


def _bit_set_offsets(start: int, bits: bytes) -> list[int]:
    """The offsets a BatchAck's bit set names (BitSet.toByteArray: bit i of byte j is start +
    8j + i); its zero bytes are skipped at C speed (a pop's offsets may lie far apart)."""
    if len(bits) > MAX_BIT_SET_BYTES:
        raise BadRequest(f"a bit set of {len(bits)} bytes (at most {MAX_BIT_SET_BYTES})", ResponseCode.INVALID_PARAMETER)
    offsets: list[int] = []
    for match in _SET_BYTES.finditer(bits):
        at, byte = match.start(), bits[match.start()]
        offsets.extend(start + at * 8 + b for b in range(8) if byte >> b & 1)
        if len(offsets) > MAX_BATCH_ACK_BITS:
            raise BadRequest(f"a bit set of more than {MAX_BATCH_ACK_BITS} offsets", ResponseCode.INVALID_PARAMETER)
    return offsets


def _in_range(value: int, name: str) -> int:
    if not 0 <= value <= VALUE_LIMIT:
        raise BadRequest(f"{name} {value} is out of range", ResponseCode.INVALID_PARAMETER)
    return value


@dataclass(slots=True, frozen=True)
class PopAsk:
    """What a pop's answer is built from, whenever it comes (at once, or after a hold)."""

    conn: RemotingConnection
    request: RemotingCommand
    group: str
    topic: str
    invisible_ms: int


class PopWaiters:
    """Pops held for new or revived messages of their queues (PopLongPollingService): one
    event per held pop, set by the store's notify or a revival."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self.closed = False  # (shutdown: no pop is held any more)

    async def wait(self, queues: list[str], timeout_s: float) -> bool:
        """True when one of ``queues`` may have something (new or revived), False on timeout."""
        if self.closed:
            return False
        event = asyncio.Event()
        for queue in queues:
            self._waiting.setdefault(queue, set()).add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            for queue in queues:
                waiting = self._waiting.get(queue)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiting[queue]

    def held(self) -> int:
        """How many pops are held now."""
        return len({event for events in self._waiting.values() for event in events})

    def wake(self, queue: str) -> None:
        for event in self._waiting.get(queue, ()):
            event.set()

    def wake_all(self) -> None:
        self.closed = True
        for waiting in self._waiting.values():
            for event in waiting:
                event.set()


def _extra_info(text: str) -> tuple[int, int, str]:
    """(pop time, invisible time, retry flag) of a client's extraInfo, as ExtraInfoUtil reads it."""
    parts = text.split(" ")
    try:
        if len(parts) < 7 or len(parts) > 8:
            raise ValueError
        for i in (0, 3, 6, 7)[:len(parts) - 4]:
            int(parts[i])
        pop_time, invisible = int(parts[1]), int(parts[2])
        if not (0 <= pop_time <= VALUE_LIMIT and 0 <= invisible <= VALUE_LIMIT):
            raise ValueError
        return pop_time, invisible, parts[4]
    except ValueError:
        raise BadRequest(f"extraInfo {text!r} is not ExtraInfoUtil's (ckOffset popTime invisibleTime "
                         "reviveQid retry brokerName queueId [offset])", ResponseCode.INVALID_PARAMETER) from None


def _batch_ack_field(ack: dict):
    """BatchAck's fields by their short JSON names, or the long ones fastjson also reads."""
    return lambda short, long: ack[short] if short in ack else ack[long]


class PopRequests(BrokerParts):
    _pop_turn = itertools.count()

    def pop_queues(self, topic: str, queue_id: int) -> list[int]:
        """The queue ids a pop of ``queue_id`` reads (-1: every queue of the topic, from a
        different one each time); BadRequest for an unknown or unreadable topic or queue."""
        config = self.topics.get(topic)
        if config is None:
            raise BadRequest(f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST)
        if not config.perm & PERM_READ:
            raise BadRequest(f"the topic[{topic}] peeking message is forbidden", ResponseCode.NO_PERMISSION)
        if queue_id >= config.read_queues:
            raise BadRequest(f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                             f"[{config.read_queues}]", ResponseCode.INVALID_PARAMETER)
        if queue_id >= 0:
            return [queue_id]
        first = next(self._pop_turn)  # queueId -1: every queue, from a different one each time
        return [(first + i) % config.read_queues for i in range(config.read_queues)]

    def pop_message(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        ext = request.ext_fields
        group, topic = _group(str_field(ext, "consumerGroup")), str_field(ext, "topic")
        max_messages = int_field(ext, "maxMsgNums")
        invisible_ms = int_field(ext, "invisibleTime")
        poll_ms = int_field(ext, "pollTime", 0)
        if get_bool(ext, "order"):
            raise BadRequest("orderly pop (order=true) is not supported by TideMQ", ResponseCode.INVALID_PARAMETER)
        if not 0 < max_messages <= MAX_POP_MESSAGES:
            raise BadRequest(f"the pop message's num must be 1 to {MAX_POP_MESSAGES}", ResponseCode.INVALID_PARAMETER)
        _in_range(invisible_ms, "invisibleTime")
        queue_ids = self.pop_queues(topic, int_field(ext, "queueId"))
        selector = self.selectors.get(ext.get("exp") or None, ext.get("expType") or None)
        pop_once = self.pop_round(conn.principal, group, topic, queue_ids, max_messages, invisible_ms, selector,
                                  int_field(ext, "initMode", 0))
        found = pop_once()
        answer = PopAsk(conn, request, group, topic, invisible_ms)
        if any(p.messages for _, p in found) or poll_ms <= 0:
            return self._pop_response(answer, found)
        return self._held_pop(answer, queue_ids, pop_once, min(poll_ms / 1000, self.long_poll_max_s))

    def pop_round(self, who: Principal, group: str, topic: str, queue_ids: list[int], max_messages: int,
                  invisible_ms: int, selector: Selector, init_mode: int = 0, ordered: Ordered | None = None
                  ) -> Callable[[], list[tuple[int, Popped]]]:
        """One pop over ``queue_ids`` of ``topic`` for ``group`` (a remoting or gRPC consumer),
        to call now and again after a hold: (queue id, what it popped) per queue visited;
        ``ordered``: the messages handed out in order (core/pop_order.py)."""
        admit = self.access.pop_admission(who, topic, lambda: self._popping_members(group, topic))

        def pop_once() -> list[tuple[int, Popped]]:
            out = []
            room = max_messages
            now = now_ms()  # (one pop time: the answer's popTime names every queue's)
            for queue_id in queue_ids:
                queue = remoting_queue(topic, queue_id)
                popped = self.pop.pop(group, queue, room, invisible_ms,
                                      lambda q, offset, n: self._read(q, topic, offset, n, selector), admit, init_mode,
                                      functools.partial(self._pull_offset, group, queue), now, ordered)
                out.append((queue_id, popped))
                if popped.next_offset is not None:  # (as RocketMQ: the group's consumer offset follows its pops)
                    self.store.commit_offset_now(CONSUMER_PREFIX + group, queue, popped.next_offset)
                room -= len(popped.messages)
                if room <= 0:
                    break
            return out
        return pop_once

    def _popping_members(self, group: str, topic: str) -> list[Principal]:
        """Who the members of ``group`` subscribed to ``topic`` are (by their heartbeats)."""
        return [member.principal for member in self.groups.members(group)
                if member.principal is not None and topic in member.subscriptions]

    def _pull_offset(self, group: str, queue: str) -> int | None:
        """Where a group new to popping a queue starts: where its pulls got to, if they did."""
        return self.store.get_offset_now(CONSUMER_PREFIX + group, queue)

    async def _held_pop(self, answer: PopAsk, queue_ids: list[int], pop_once, timeout_s: float) -> RemotingCommand:
        return self._pop_response(answer, await self.held_pop(answer.topic, queue_ids, pop_once, timeout_s))

    async def held_pop(self, topic: str, queue_ids: list[int], pop_once: Callable[[], list[tuple[int, Popped]]],
                       timeout_s: float) -> list[tuple[int, Popped]]:
        """``pop_once`` again whenever a queue may have something, until it pops some or
        ``timeout_s`` is up (PopLongPollingService)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        queues = [remoting_queue(topic, q) for q in queue_ids]
        found: list[tuple[int, Popped]] = []
        while (left := deadline - loop.time()) > 0 and await self.pop_waiters.wait(queues, left):
            found = pop_once()
            if any(p.messages for _, p in found):
                break
        return found

    def _pop_response(self, answer: PopAsk, found: list[tuple[int, Popped]]) -> RemotingCommand:
        conn, request, group, topic, invisible_ms = (answer.conn, answer.request, answer.group, answer.topic,
                                                     answer.invisible_ms)
        popped = [(qid, p) for qid, p in found if p.messages]
        pop_time = popped[0][1].pop_time_ms if popped else (found[0][1].pop_time_ms if found else 0)
        ext = {"popTime": str(pop_time), "invisibleTime": str(invisible_ms), "reviveQid": "0",
               "restNum": str(sum(p.rest for _, p in found))}
        if not popped:
            return response_to(request, ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", ext_fields=ext)
        body = []
        start_info, offset_info = [], []
        for queue_id, p in popped:
            for message, cp in zip(p.messages, p.points):
                wire = to_wire(message, topic, queue_id, self.origin)
                wire.queue_offset = cp.offset
                wire.reconsume_times += cp.attempts
                body.append(encode_message(wire))
            start_info.append(f"{NORMAL} {queue_id} {p.points[0].offset}")
            offset_info.append(f"{NORMAL} {queue_id} " + ",".join(str(cp.offset) for cp in p.points))
        ext["startOffsetInfo"] = ";".join(start_info)
        ext["msgOffsetInfo"] = ";".join(offset_info)
        self.stats.messages_sent += len(body)
        if conn.tracer is not None:  # (each message's ack is traced when it comes)
            client = f"{group}@{conn.client_id or conn.peer}"
            for _, p in popped:
                for cp in p.points:
                    conn.tracer.delivered("remoting", client, cp.position, p.queue, cp.offset, 1)
        return response_to(request, ResponseCode.SUCCESS, "FOUND", ext_fields=ext, body=b"".join(body))

    # -- ack / change --------------------------------------------------------------------------
    def _acked_queue(self, topic: str, queue_id: int) -> str:
        config = self.topics.get(topic)
        if config is None:
            raise BadRequest(f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST)
        if not 0 <= queue_id < config.read_queues:
            raise BadRequest(f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                             f"[{config.read_queues}]", ResponseCode.MESSAGE_ILLEGAL)
        return remoting_queue(topic, queue_id)

    def ack_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group, topic = _group(str_field(ext, "consumerGroup")), str_field(ext, "topic")
        queue = self._acked_queue(topic, int_field(ext, "queueId"))
        pop_time, invisible, retry = _extra_info(str_field(ext, "extraInfo"))
        offset = _in_range(int_field(ext, "offset"), "offset")
        acked = self.pop.ack(group, queue, offset, pop_time + invisible) if retry == NORMAL else None
        if acked is not None:
            self._trace_acks(conn, group, [acked])
            return response_to(request, ResponseCode.SUCCESS)
        return response_to(request, ResponseCode.NO_MESSAGE, "no such check point: acked already, or its invisible "
                                                             "time ran out and the message came back")

    def batch_ack_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """BatchAckMessageRequestBody: per (queue, pop) a start offset and a bit set of acked
        offsets (fastjson: base64 of BitSet.toByteArray, little-endian bits). Read whole
        before any ack is applied: a bad one refuses them all."""
        wanted = []
        try:
            body = json.loads(request.body or b"null")
            acks = body["acks"] if isinstance(body, dict) else None
            if not isinstance(acks, list) or not acks:
                return response_to(request, ResponseCode.NO_MESSAGE, "no acks")
            for ack in acks:
                get = _batch_ack_field(ack)
                group, topic = _group(str(get("c", "consumerGroup"))), str(get("t", "topic"))
                self.access.check_topic(conn.principal, topic, Right.READ, "batch_ack_message")
                queue = self._acked_queue(topic, int(get("q", "queueId")))
                start = _in_range(int(get("so", "startOffset")), "startOffset")
                due = _in_range(int(get("pt", "popTime")), "popTime") + _in_range(int(get("it", "invisibleTime")),
                                                                                  "invisibleTime")
                offsets = _bit_set_offsets(start, base64.b64decode(get("b", "bitSet") or "", validate=True))
                wanted.append((group, queue, offsets, due, str(get("r", "retry")) == NORMAL))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadRequest(f"the batch ack body is not a BatchAckMessageRequestBody: {exc!r}",
                             ResponseCode.INVALID_PARAMETER) from None
        found = 0
        for group, queue, offsets, due, normal in wanted:
            if normal:
                acked = self.pop.ack_many(group, queue, offsets, due)
                self._trace_acks(conn, group, acked)
                found += len(acked)
        total = sum(len(w[2]) for w in wanted)
        if found < total:
            return response_to(request, ResponseCode.NO_MESSAGE, f"{total - found} of {total} check points were "
                                                                 "gone: acked already, or their messages came back")
        return response_to(request, ResponseCode.SUCCESS)

    def change_invisible_time(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group, topic = _group(str_field(ext, "consumerGroup")), str_field(ext, "topic")
        queue = self._acked_queue(topic, int_field(ext, "queueId"))
        pop_time, invisible, retry = _extra_info(str_field(ext, "extraInfo"))
        new_invisible = _in_range(int_field(ext, "invisibleTime"), "invisibleTime")
        new_pop_time = None if retry != NORMAL else \
            self.pop.change(group, queue, _in_range(int_field(ext, "offset"), "offset"), pop_time + invisible,
                            new_invisible)
        if new_pop_time is None:  # (the header's fields anyway: the Java client decodes them before the code)
            return response_to(request, ResponseCode.NO_MESSAGE, "no such check point: acked already, or its "
                               "invisible time ran out and the message came back",
                               ext_fields={"popTime": "0", "invisibleTime": "0", "reviveQid": "0"})
        return response_to(request, ResponseCode.SUCCESS, ext_fields={
            "popTime": str(new_pop_time), "invisibleTime": str(new_invisible), "reviveQid": "0"})

    def _trace_acks(self, conn: RemotingConnection, group: str, acked: list[CheckPoint]) -> None:
        if conn.tracer is not None:
            client = f"{group}@{conn.client_id or conn.peer}"
            for cp in acked:
                conn.tracer.acked("remoting", client, cp.position, cp.queue, cp.offset)

    # -- revive's ends -------------------------------------------------------------------------
    def _pop_ready(self, group: str, queue: str) -> None:
        self.pop_waiters.wake(queue)

    async def _pop_dead_letter(self, cp: CheckPoint, message: StoredMessage, attempts: int) -> None:
        """A popped message not acked after the group's max reconsume times: into %DLQ%{group}."""
        topic = (remoting_topic_of(cp.queue) or (message.topic, 0))[0]
        props = user_properties(message)
        props.setdefault(RETRY_TOPIC, topic)
        props.setdefault(ORIGIN_MESSAGE_ID, self.msg_id(message.position))
        props[ORIGIN_TOPIC_PROPERTY] = origin_topic(message)  # (access.py: its readers are checked by it)
        dlq = dlq_topic(cp.group)
        self.topics.ensure(dlq, 1)
        reconsume = int(message.properties.get(RECONSUME_PROPERTY, "0")) + attempts
        await self.store.put(restore(message, dlq, props, reconsume_times=reconsume), [remoting_queue(dlq, 0)])
