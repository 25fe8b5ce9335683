"""Retries, dead letters and delayed messages: CONSUMER_SEND_MSG_BACK into ``%RETRY%{group}``
through a delay level, ``%DLQ%{group}`` past the consumer's max reconsume times, and where a
message about to be stored goes (its topic queues, held by the gateway's one timer until its
delay level's time when it has one). Mixed into ``RemotingBroker``. (``_deliver_delayed`` only
drains the level queues ``sched:{level}`` that data dirs of earlier versions may hold.)"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.properties import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RETRY_TOPIC,
)
from store import StoredMessage
from store import TIMER

from ..interop import remoting_queue
from .broker_parts import BrokerParts
from .messages import (
    INTERNAL_PREFIXES,
    ORIGIN_TOPIC_PROPERTY,
    RECONSUME_PROPERTY,
    restore,
    user_properties,
)
from .messages import origin_topic as first_topic
from .requests import int_field, str_field
from .topics import dlq_topic, retry_topic

if TYPE_CHECKING:
    from .connection import RemotingConnection

log = logging.getLogger("tidemq.remoting")


class RetryRequests(BrokerParts):
    def _placement(self, topic: str, queue_id: int, properties: dict[str, str], reconsume_times: int,
                   max_reconsume: int) -> tuple[str, int, dict[str, str], list[str], int | None]:
        """(record topic, queue id, properties, store queues, due time) for a message about to be
        stored: one with a delay level is held by the gateway's timer until its level's delay has
        passed (the due time, ms; else None), exhausted retries go to the DLQ."""
        if topic.startswith("%RETRY%") and reconsume_times > max_reconsume:
            group = topic[len("%RETRY%"):]
            topic, queue_id = dlq_topic(group), 0
            self.topics.ensure(topic, 1)
            properties = {k: v for k, v in properties.items() if k != DELAY}
        level = int_field(properties, DELAY, 0) if DELAY in properties else 0
        due = None
        if level > 0:
            level = self.schedule.clamp(level)
            properties = {**properties, DELAY: str(level)}
            due = int(time.time() * 1000) + int(self.schedule.delays_s[level - 1] * 1000)
        return (self._record_topic(topic, properties), queue_id, properties, self.targets(topic, queue_id, properties),
                due)

    async def _deliver_delayed(self, message: StoredMessage) -> None:
        """A scheduled message whose time has come: stored again into its real queues."""
        props = dict(message.properties)
        topic = props.pop(REAL_TOPIC, None)
        queue_id = int(props.pop(REAL_QUEUE_ID, "0") or 0)
        props.pop(DELAY, None)
        if not topic:
            log.error("delayed message without its real topic dropped msg_id=%s", message.msg_id)
            return
        queue_id = self._writable(topic, queue_id)
        user = {k: v for k, v in props.items() if not k.startswith(INTERNAL_PREFIXES)}
        await self.store.put(restore(message, self._record_topic(topic, user), user),
                             self.targets(topic, queue_id, user))

    def send_back(self, conn: RemotingConnection, request: RemotingCommand):
        """The message at commitlog ``offset`` into the group's retry topic (or its DLQ); only
        a message the sender could have pulled (access.py)."""
        position = int_field(request.ext_fields, "offset")
        original = self.store.read_at(position)
        if original is None:
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {position}")
        self.access.check_read(conn.principal, original, "send back")
        return self._send_back(request, original)

    async def _send_back(self, request: RemotingCommand, original: StoredMessage) -> RemotingCommand:
        ext = request.ext_fields
        group = str_field(ext, "group")
        delay_level = int_field(ext, "delayLevel", 0)
        max_reconsume = int_field(ext, "maxReconsumeTimes", self.max_reconsume_times)
        props = user_properties(original)
        reconsume = int(original.properties.get(RECONSUME_PROPERTY, "0")) + 1
        origin_topic = ext.get("originTopic") or props.get(RETRY_TOPIC) or original.topic
        props.setdefault(RETRY_TOPIC, origin_topic)
        props[ORIGIN_TOPIC_PROPERTY] = first_topic(original)  # (access.py: its readers are checked by it)
        props.setdefault(ORIGIN_MESSAGE_ID, ext.get("originMsgId") or self.msg_id(original.position))
        props[MAX_RECONSUME_TIMES] = str(max_reconsume)
        if reconsume > max_reconsume or delay_level < 0:
            topic, queue_id = dlq_topic(group), 0
            self.topics.ensure(topic, 1)
            props.pop(DELAY, None)
            targets = [remoting_queue(topic, queue_id)]
            record_topic, due = topic, None
        else:
            topic, queue_id = retry_topic(group), 0
            self.topics.ensure(topic, 1)
            level = delay_level if delay_level > 0 else 3 + reconsume - 1
            props[DELAY] = str(self.schedule.clamp(level))
            record_topic, queue_id, props, targets, due = self._placement(topic, queue_id, props, 0, max_reconsume)
        message = restore(original, record_topic, props, reconsume_times=reconsume)
        if due is not None:  # held by the gateway's timer until its level's delay has passed
            message.hold_kind, message.hold_due_ms = TIMER, due
        await self.store.put(message, targets)
        return response_to(request, ResponseCode.SUCCESS)

