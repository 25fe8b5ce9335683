"""A popped message as a gRPC consumer receives it: the remoting view of the record (its
properties as a remoting consumer of the topic sees them) in RocketMQ 5's message shape; a
timer message (a remoting one's too) is a DELAY message with its delivery timestamp, one with
a sharding key a FIFO message of that message group."""

from __future__ import annotations

import zlib

from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.remoting.properties import DELAY, KEYS, SHARDING_KEY, TAGS, TIMER_OUT_MS, UNIQ_KEY
from protocols.rocketmq_grpc.receipts import Receipt
from store import CheckPoint, StoredMessage

from ..remoting.messages import BORN_HOST_PROPERTY, RECONSUME_PROPERTY, shown_properties
from ..remoting.timers import TIMER_PROPERTIES


def grpc_message(message: StoredMessage, topic: str, queue_id: int, point: CheckPoint, due_ms: int,
                 invisible_ms: int, offset_msg_id: str) -> pb.Message:
    """``message`` popped from ``topic``'s queue ``queue_id`` under check point ``point``, due
    at ``due_ms`` (its pop's time plus ``invisible_ms``). Its body's CRC32 goes with it (the
    clients check it)."""
    shown = shown_properties(message, topic)
    tag, keys, message_id = shown.pop(TAGS, ""), shown.pop(KEYS, ""), shown.pop(UNIQ_KEY, "")
    shown.pop(DELAY, None)
    group = shown.pop(SHARDING_KEY, "")  # (a FIFO message's message group)
    due = shown.pop(TIMER_OUT_MS, None)  # (when a timer message was due: a DELAY one's delivery time)
    for name in TIMER_PROPERTIES:
        shown.pop(name, None)
    system = pb.SystemProperties(
        tag=tag, keys=keys.split(), message_id=message_id or offset_msg_id, body_encoding=pb.IDENTITY,
        message_type=pb.FIFO if group else pb.NORMAL if due is None else pb.DELAY, message_group=group or None, born_host=message.properties.get(BORN_HOST_PROPERTY, ""), queue_id=queue_id,
        queue_offset=point.offset, receipt_handle=Receipt(queue_id, point.offset, due_ms).encode(),
        delivery_attempt=int(message.properties.get(RECONSUME_PROPERTY, "0")) + point.attempts + 1)
    body = bytes(message.body)
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = format(zlib.crc32(body), "08X")
    system.born_timestamp.FromMilliseconds(message.born_timestamp)
    system.store_timestamp.FromMilliseconds(message.store_timestamp)
    system.invisible_duration.FromMilliseconds(invisible_ms)
    if due is not None and due.isdigit():
        system.delivery_timestamp.FromMilliseconds(int(due))
    return pb.Message(topic=pb.Resource(name=topic), user_properties=shown, system_properties=system,
                      body=body)
