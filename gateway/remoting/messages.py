"""Remoting messages <-> store records.

A remoting send is stored as one record: topic, body, the client's properties (TAGS, KEYS,
UNIQ_KEY, user properties...) as they came, the message's keys and UNIQ_KEY as the record key
(so query-by-key finds both), its tag for the consume-queue tag hash, and its RocketMQ
``flag``. What the wire format needs and the record has no field for -- sysFlag, reconsume
times, the born host -- travels in internal properties (``rmq.*``) that pulls strip again.

A record from another protocol (an MQTT publish indexed into a remoting topic queue) is
presented with its remoting topic, ``mqttSecondTopic`` for the rest of its MQTT levels and
``qoslevel``; other protocols' internal properties (``mqtt.*``, ``amqp.*``) are not shown.
"""

from __future__ import annotations

import socket
import zlib
from dataclasses import dataclass

from protocols.remoting.codes import ResponseCode
from protocols.remoting.message_codec import (
    COMPRESSED_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    WireMessage,
)
from protocols.mqtt.topics import TopicError, validate_topic_name
from protocols.remoting.properties import DELAY, KEYS, RETRY_TOPIC, TAGS, TRAN_MSG, UNIQ_KEY, decode_properties
from store import Message, StoredMessage

from ..interop import DLQ_PREFIX, RETRY_PREFIX, SECOND_TOPIC_PROPERTY, mqtt_topic_of
from .requests import BadRequest

REMOTING_FLAG = 0x400  # record flag marker: a remoting message whose own flag is in FLAG_PROPERTY
PROTOCOL_FLAG_BITS = 0xF00  # the bits of the record flag other protocols use as markers
FLAG_PROPERTY = "rmq.flag"
SYS_FLAG_PROPERTY = "rmq.sys"
RECONSUME_PROPERTY = "rmq.rc"
BORN_HOST_PROPERTY = "rmq.bh"
# the MQTT topic a message given back (retry, DLQ) was first on: the ACL checks its readers by it
ORIGIN_TOPIC_PROPERTY = "rmq.ot"
QOS_PROPERTY = "qoslevel"
INTERNAL_PREFIXES = ("rmq.", "mqtt.", "amqp.")
MQTT_FLAG = 0x100  # gateway.mqtt.messages: the QoS is in the low two bits


@dataclass(slots=True)
class Origin:
    """The storing node as pulls present it (RocketMQ's store host)."""

    host: bytes  # 4-byte IPv4
    port: int

    @classmethod
    def of(cls, host: str, port: int) -> Origin:
        try:
            packed = socket.inet_aton(host)
        except OSError:
            packed = b"\x7f\x00\x00\x01"
        return cls(packed, port)


def client_properties(text: str | None) -> dict[str, str]:
    """A send's properties; MESSAGE_ILLEGAL for a name of the gateway's internal ones (``rmq.*``,
    the other protocols'): only the gateway sets those (the ACL judges readers by ``rmq.ot``),
    as RocketMQ's client refuses the names its system uses."""
    return checked_properties(decode_properties(text or ""))


def checked_properties(properties: dict[str, str]) -> dict[str, str]:
    """``properties`` of a send, refused (MESSAGE_ILLEGAL) when one is named as the gateway's
    internal ones are."""
    internal = sorted(name for name in properties if name.startswith(INTERNAL_PREFIXES))
    if internal:
        raise BadRequest(f"the property {internal[0]} is used by the system (names starting "
                         f"{', '.join(INTERNAL_PREFIXES)}), input another please", ResponseCode.MESSAGE_ILLEGAL)
    return properties


def record_key(properties: dict[str, str]) -> str | None:
    """The keys the store indexes: KEYS (space separated) and UNIQ_KEY."""
    keys = properties.get(KEYS, "").split()
    uniq = properties.get(UNIQ_KEY)
    if uniq:
        keys.append(uniq)
    return " ".join(dict.fromkeys(keys)) or None


def to_store_message(topic: str, body: bytes, properties: dict[str, str], *, flag: int, sys_flag: int,
                     born_timestamp: int, born_host: str, reconsume_times: int = 0) -> Message:
    props = dict(properties)
    record_flag = flag & 0xFFFFFFFF
    if record_flag & PROTOCOL_FLAG_BITS:  # would read as another protocol's marker
        props[FLAG_PROPERTY] = str(record_flag)
        record_flag = REMOTING_FLAG
    if sys_flag:
        props[SYS_FLAG_PROPERTY] = str(sys_flag)
    if reconsume_times:
        props[RECONSUME_PROPERTY] = str(reconsume_times)
    props[BORN_HOST_PROPERTY] = born_host
    return Message(topic, body, properties=props, key=record_key(properties), tags=properties.get(TAGS) or None,
                   born_timestamp=born_timestamp, flag=record_flag)


def plain_body(body: bytes, sys_flag: int, max_size: int) -> tuple[bytes, int]:
    """A body the client compressed (sysFlag COMPRESSED, e.g. ali-ons above 4 KiB) is stored
    inflated, the flag cleared: MQTT and AMQP readers of the same record get the payload,
    and remoting consumers read plain bodies as well as compressed ones."""
    if not sys_flag & COMPRESSED_FLAG:
        return body, sys_flag
    inflater = zlib.decompressobj()
    try:
        plain = inflater.decompress(body, max_size + 1)
    except zlib.error as exc:
        raise BadRequest(f"the compressed body does not inflate: {exc}", ResponseCode.MESSAGE_ILLEGAL) from None
    if len(plain) > max_size or inflater.unconsumed_tail:
        raise BadRequest("the body inflates beyond the message size limit", ResponseCode.MESSAGE_ILLEGAL)
    return plain, sys_flag & ~COMPRESSED_FLAG


def origin_topic(message: StoredMessage) -> str:
    """The topic the ACL judges a message by: the one it was first stored on."""
    return message.properties.get(ORIGIN_TOPIC_PROPERTY) or message.topic


def resent_from(topic: str, properties: dict[str, str]) -> str | None:
    """For a message sent straight to a group's retry or dead-letter topic (what a consumer
    whose send-back failed does): the MQTT topic it was first on, from its ``RETRY_TOPIC``
    property (and ``mqttSecondTopic``); None when it names none, or ``topic`` is no such topic."""
    first = properties.get(RETRY_TOPIC)
    if not first or not topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
        return None
    origin = mqtt_topic_of(first, properties.get(SECOND_TOPIC_PROPERTY))
    try:
        validate_topic_name(origin or "")
    except TopicError:
        return None
    return origin


def with_origin(topic: str, properties: dict[str, str]) -> dict[str, str]:
    """A send's properties as stored: one resent to a retry or dead-letter topic keeps the
    topic it was first on, by which its readers are checked (access.py)."""
    origin = resent_from(topic, properties)
    return properties if origin is None else {**properties, ORIGIN_TOPIC_PROPERTY: origin}


def user_properties(message: StoredMessage) -> dict[str, str]:
    """The properties a remoting client sees (internal ones stripped)."""
    return {k: v for k, v in message.properties.items() if not k.startswith(INTERNAL_PREFIXES)}


def client_flag(message: StoredMessage) -> int:
    """The RocketMQ ``flag`` of a stored message as clients see it: its own for a remoting
    message, 0 for another protocol's (their record flag holds markers, not an app's flag)."""
    flag = message.flag
    if flag & REMOTING_FLAG or FLAG_PROPERTY in message.properties:
        return int(message.properties.get(FLAG_PROPERTY, "0"))
    return 0 if flag & PROTOCOL_FLAG_BITS else flag


def restore(message: StoredMessage, topic: str, properties: dict[str, str], *,
            reconsume_times: int | None = None) -> Message:
    """A stored message made ready to be stored again (a retry, a due delayed message) under
    ``topic`` with ``properties``, keeping what only the internal properties remember."""
    internal = message.properties
    if ORIGIN_TOPIC_PROPERTY in internal and ORIGIN_TOPIC_PROPERTY not in properties:
        properties = {**properties, ORIGIN_TOPIC_PROPERTY: internal[ORIGIN_TOPIC_PROPERTY]}
    return to_store_message(
        topic, message.body, properties, flag=client_flag(message),
        sys_flag=int(internal.get(SYS_FLAG_PROPERTY, "0")), born_timestamp=message.born_timestamp,
        born_host=internal.get(BORN_HOST_PROPERTY, ""),
        reconsume_times=int(internal.get(RECONSUME_PROPERTY, "0")) if reconsume_times is None else reconsume_times)


def shown_properties(message: StoredMessage, remoting_topic: str) -> dict[str, str]:
    """The properties a remoting consumer of ``remoting_topic`` gets with the message (and a
    SQL92 subscription filters on): its own, plus the QoS and MQTT levels of an MQTT publish."""
    shown = user_properties(message)
    if message.flag & MQTT_FLAG:  # an MQTT publish: its QoS too
        shown[QOS_PROPERTY] = str(message.flag & 3)
    if message.topic != remoting_topic and message.topic.startswith(remoting_topic + "/"):
        shown[SECOND_TOPIC_PROPERTY] = message.topic[len(remoting_topic):]  # the MQTT levels after it
    return shown


def to_wire(message: StoredMessage, remoting_topic: str, queue_id: int, origin: Origin, *,
            half: bool = False) -> WireMessage:
    """The message as remoting consumers get it; ``half``: a transaction's half message as a
    check shows it to its producer (else one stored half is committed by now: RocketMQ clears
    its TRAN_MSG and gives it the commit type)."""
    props = message.properties
    shown = shown_properties(message, remoting_topic)
    sys_flag = int(props.get(SYS_FLAG_PROPERTY, "0"))
    shown.pop(DELAY, None)  # (held by the timer until its level's time, stored once: RocketMQ clears it then)
    if not half and sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_PREPARED_TYPE:
        sys_flag = sys_flag & ~TRANSACTION_ROLLBACK_TYPE | TRANSACTION_COMMIT_TYPE
        shown.pop(TRAN_MSG, None)
    born_host, born_port = _host_port(props.get(BORN_HOST_PROPERTY), origin)
    return WireMessage(
        topic=remoting_topic,
        body=message.body,
        queue_id=queue_id,
        flag=client_flag(message),
        queue_offset=message.queue_offset,
        commit_log_offset=message.position,
        sys_flag=sys_flag,
        born_timestamp=message.born_timestamp,
        born_host=born_host,
        born_port=born_port,
        store_timestamp=message.store_timestamp,
        store_host=origin.host,
        store_port=origin.port,
        reconsume_times=int(props.get(RECONSUME_PROPERTY, "0")),
        prepared_transaction_offset=0,
        properties=shown,
    )


def _host_port(text: str | None, origin: Origin) -> tuple[bytes, int]:
    if text:
        host, _, port = text.rpartition(":")
        try:
            return socket.inet_aton(host), int(port)
        except (OSError, ValueError):
            pass
    return origin.host, 0
