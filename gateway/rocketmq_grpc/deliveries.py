"""A stored message as a gRPC client gets it: the remoting view of the record (its properties
as a remoting consumer of the topic sees them) in RocketMQ 5's message shape -- a popped one
for a consumer, a half message for its producer's transaction check. A timer message (a
remoting one's too) is a DELAY message with its delivery timestamp, one with a sharding key a
FIFO message of that message group, one sent in a transaction a TRANSACTION message (as
RocketMQ 5's proxy shows them)."""

from __future__ import annotations

import zlib
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.remoting.properties import (
    DELAY,
    KEYS,
    PGROUP,
    SHARDING_KEY,
    TAGS,
    TIMER_OUT_MS,
    TRAN_MSG,
    UNIQ_KEY,
)
from protocols.rocketmq_grpc.receipts import Receipt
from store import CheckPoint, StoredMessage

from ..remoting.messages import BORN_HOST_PROPERTY, RECONSUME_PROPERTY, shown_properties
from ..remoting.timers import TIMER_PROPERTIES


MAX_TIMESTAMP_MS = 253_402_300_800_000  # (up to 9999-12-31: what a protobuf Timestamp holds)


def grpc_message(message: StoredMessage, topic: str, queue_id: int, point: CheckPoint, due_ms: int,
                 invisible_ms: int, offset_msg_id: str) -> pb.Message:
    """``message`` popped from ``topic``'s queue ``queue_id`` under check point ``point``, due
    at ``due_ms`` (its pop's time plus ``invisible_ms``)."""
    out = _as_grpc(message, topic, queue_id, offset_msg_id)
    system = out.system_properties
    system.queue_offset = point.offset
    system.receipt_handle = Receipt(queue_id, point.offset, due_ms).encode()
    system.delivery_attempt = int(message.properties.get(RECONSUME_PROPERTY, "0")) + point.attempts + 1
    system.invisible_duration.FromMilliseconds(invisible_ms)
    return out


def grpc_half_message(message: StoredMessage, topic: str, queue_id: int, offset_msg_id: str) -> pb.Message:
    """A transaction's half message, as a check shows it to its producer."""
    out = _as_grpc(message, topic, queue_id, offset_msg_id)
    out.system_properties.message_type = pb.TRANSACTION
    return out


def _as_grpc(message: StoredMessage, topic: str, queue_id: int, offset_msg_id: str) -> pb.Message:
    """What every gRPC view of ``message`` in ``topic``'s queue ``queue_id`` shows. Its body's
    CRC32 goes with it (the clients check it)."""
    shown = shown_properties(message, topic)
    tag, keys, message_id = shown.pop(TAGS, ""), shown.pop(KEYS, ""), shown.pop(UNIQ_KEY, "")
    group = shown.pop(SHARDING_KEY, "")  # (a FIFO message's message group)
    due = shown.pop(TIMER_OUT_MS, "")  # (when a timer message was due: a DELAY one's delivery time)
    due_ms = int(due) if due.isascii() and due.isdigit() and len(due) <= 15 else None  # (a remoting sender's: any)
    transactional = shown.pop(TRAN_MSG, "").lower() == "true"
    for name in (DELAY, PGROUP, *TIMER_PROPERTIES):
        shown.pop(name, None)
    kind = pb.TRANSACTION if transactional else pb.FIFO if group else pb.DELAY if due_ms is not None else pb.NORMAL
    system = pb.SystemProperties(
        tag=tag, keys=keys.split(), message_id=message_id or offset_msg_id, body_encoding=pb.IDENTITY,
        message_type=kind, message_group=group or None,
        born_host=message.properties.get(BORN_HOST_PROPERTY, ""), queue_id=queue_id)
    body = bytes(message.body)
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = format(zlib.crc32(body), "08X")
    _set_time(system.born_timestamp, message.born_timestamp)
    _set_time(system.store_timestamp, message.store_timestamp)
    if due_ms is not None:
        _set_time(system.delivery_timestamp, due_ms)
    return pb.Message(topic=pb.Resource(name=topic), user_properties=shown, system_properties=system, body=body)


def _set_time(field: Any, ms: int) -> None:  # (a google.protobuf Timestamp)
    """``field`` set to ``ms`` when a Timestamp can hold it (a remoting sender's born time is
    any number it chose), else left unset."""
    if 0 <= ms < MAX_TIMESTAMP_MS:
        field.FromMilliseconds(ms)
