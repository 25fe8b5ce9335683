"""A gRPC ``Message`` as the remoting side stores a send: its tag, keys and message id become
the remoting properties (TAGS, KEYS, UNIQ_KEY) beside the user properties, so remoting, MQTT
and AMQP readers see it as any RocketMQ message; a DELAY message's delivery timestamp becomes
RocketMQ's TIMER_DELIVER_MS, a FIFO message's message group its sharding key
(__SHARDINGKEY), a TRANSACTION message a half message (TRAN_MSG) of the producer group named
as the topic, as its proxy converts them. Types this gateway does not take over
gRPC yet are refused with the protocol's code, never stored as another type."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.remoting.properties import (
    DELAY,
    KEYS,
    PGROUP,
    SHARDING_KEY,
    START_DELIVER_TIME,
    TAGS,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TRAN_MSG,
    UNIQ_KEY,
)

SUPPORTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)  # the message types the routes accept
# the remoting properties a gRPC message's system properties set: never user properties
RESERVED_PROPERTIES = (TAGS, KEYS, UNIQ_KEY, DELAY, SHARDING_KEY, START_DELIVER_TIME, TIMER_DELAY_MS,
                       TIMER_DELAY_SEC, TIMER_DELIVER_MS, TIMER_OUT_MS, TRAN_MSG, PGROUP)


class GrpcRequestError(Exception):
    """A request the protocol refuses with a specific status ``code`` (``definition_pb2.Code``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class GrpcSend:
    """One message of a SendMessage request, as the store takes it."""

    topic: str
    body: bytes
    properties: dict[str, str]
    born_timestamp: int  # ms
    born_host: str
    message_id: str


def grpc_send(message: pb.Message) -> GrpcSend:
    """The send of ``message``; GrpcRequestError for one this gateway cannot take."""
    system = message.system_properties
    if system.message_type not in SUPPORTED_TYPES:
        name = pb.MessageType.Name(system.message_type) if system.message_type in pb.MessageType.values() \
            else str(system.message_type)
        raise GrpcRequestError(pb.UNSUPPORTED, f"message type {name} is not supported over gRPC by TideMQ yet "
                                               f"(NORMAL, FIFO, DELAY and TRANSACTION are)")
    delayed = system.message_type == pb.DELAY
    if bool(system.message_group) != (system.message_type == pb.FIFO):
        raise GrpcRequestError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                               "a FIFO message has a message group, and only a FIFO message has one")
    if system.HasField("delivery_timestamp") != delayed:
        raise GrpcRequestError(pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                               "a DELAY message has a delivery timestamp, and only a DELAY message has one")
    if system.body_encoding not in (pb.ENCODING_UNSPECIFIED, pb.IDENTITY):
        raise GrpcRequestError(pb.UNSUPPORTED, "only IDENTITY bodies are taken (no GZIP)")
    if not message.body:
        raise GrpcRequestError(pb.MESSAGE_BODY_EMPTY, "the message body is empty")
    if not system.message_id:
        raise GrpcRequestError(pb.ILLEGAL_MESSAGE_ID, "the message has no message id")
    for key in system.keys:
        if not key or any(c.isspace() for c in key):
            raise GrpcRequestError(pb.ILLEGAL_MESSAGE_KEY, f"message key {key!r} is empty or has white space")
    if system.tag and ("|" in system.tag or system.tag.isspace()):
        raise GrpcRequestError(pb.ILLEGAL_MESSAGE_TAG, f"message tag {system.tag!r} may not contain '|'")
    properties = dict(message.user_properties)
    for name in RESERVED_PROPERTIES:
        if name in properties:
            raise GrpcRequestError(pb.ILLEGAL_MESSAGE_PROPERTY_KEY, f"the user property {name} is reserved")
    if system.message_type == pb.TRANSACTION:  # (a half message; its producer group: the topic, as the proxy's)
        properties[TRAN_MSG], properties[PGROUP] = "true", message.topic.name
    if system.message_group:  # (RocketMQ's sharding key: its queue, by the key, as remoting's)
        properties[SHARDING_KEY] = system.message_group
    if delayed:
        due_ms = time_ms(system.delivery_timestamp, pb.ILLEGAL_DELIVERY_TIME, "the delivery timestamp")
        if due_ms <= 0:
            raise GrpcRequestError(pb.ILLEGAL_DELIVERY_TIME, "the delivery timestamp is before 1970")
        properties[TIMER_DELIVER_MS] = str(due_ms)
    if system.tag:
        properties[TAGS] = system.tag
    if system.keys:
        properties[KEYS] = " ".join(system.keys)
    properties[UNIQ_KEY] = system.message_id
    born_ms = time_ms(system.born_timestamp, pb.BAD_REQUEST, "the born timestamp") \
        if system.HasField("born_timestamp") else 0
    if born_ms < 0:
        raise GrpcRequestError(pb.BAD_REQUEST, "the born timestamp is before 1970")
    return GrpcSend(message.topic.name, message.body, properties, born_ms, system.born_host, system.message_id)


def send_identity(client_id: str, topic: str, message_id: str) -> tuple[bytes, int]:
    """The store's idempotent-put number of a send (store/write/idempotence.py): the official
    clients keep a message's id across their retries, so a retry whose first answer was lost
    (with a store leader) is answered as the first time, not stored again. Its own producer id
    per (client, topic, message id), number 1: message ids are not numbers in send order."""
    digest = hashlib.blake2b(f"{client_id}\0{topic}\0{message_id}".encode(), digest_size=20).hexdigest()
    return f"grpc:{digest}".encode(), 1


def time_ms(value: Any, code: int, what: str) -> int:
    """A Timestamp's or Duration's milliseconds; GrpcRequestError ``code`` when it is none
    (out of its type's range, nanos of the wrong sign)."""
    try:
        return int(value.ToMilliseconds())
    except ValueError as exc:
        raise GrpcRequestError(code, f"{what} is not valid: {exc}") from None


def status(code: int, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or pb.Code.Name(code))
