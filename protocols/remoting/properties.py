"""Message properties as RocketMQ carries them (``name \\x01 value \\x02`` pairs), the
well-known property names (MessageConst), and SEND_BATCH_MESSAGE bodies: messages back to back
as MessageDecoder.encodeMessages writes them."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import RemotingProtocolError

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "  # between the keys of KEYS

# MessageConst property names
KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"  # "false": the producer does not wait for the flush
DELAY = "DELAY"  # delay level, 1-based
RETRY_TOPIC = "RETRY_TOPIC"  # the original topic of a message in %RETRY%{group}
REAL_TOPIC = "REAL_TOPIC"  # the topic of a delayed / half message before it was parked
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"  # "true": a transaction's half message
PGROUP = "PGROUP"  # producer group
MIN_OFFSET = "MIN_OFFSET"  # added by the pulling client from the pull reply
MAX_OFFSET = "MAX_OFFSET"
BUYER_ID = "BUYER_ID"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # the id a retried message had
TRANSFER_FLAG = "TRANSFER_FLAG"
CORRECTION_FLAG = "CORRECTION_FLAG"
MQ2_FLAG = "MQ2_FLAG"
RECONSUME_TIME = "RECONSUME_TIME"
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"
UNIQ_KEY = "UNIQ_KEY"  # the client-made message id (PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
EXTEND_UNIQ_INFO = "EXTEND_UNIQ_INFO"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME = "CONSUME_START_TIME"
INNER_NUM = "INNER_NUM"
INNER_BASE = "INNER_BASE"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_ID = "__transactionId__"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID = "INSTANCE_ID"
CORRELATION_ID = "CORRELATION_ID"
REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
TTL = "TTL"
CLUSTER = "CLUSTER"
MSG_TYPE = "MSG_TYPE"
SHARDING_KEY = "__SHARDINGKEY"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
START_DELIVER_TIME = "__STARTDELIVERTIME"  # ONS (Aliyun's 4.x clients): the delivery time, ms
TIMER_OUT_MS = "TIMER_OUT_MS"  # set by the broker: when a timer message was due
BORN_HOST = "__BORNHOST"
BORN_TIMESTAMP = "BORN_TIMESTAMP"
CRC32 = "__CRC32#"
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
# the gateway's names for the same properties
REAL_QUEUE_ID = REAL_QID
TRANSACTION_PREPARED = TRAN_MSG
PRODUCER_GROUP = PGROUP


def decode_properties(raw: str | bytes | memoryview) -> dict[str, str]:
    """Properties from their string form. A pair is split at its first ``\\x01``; pairs without
    a name or a separator are dropped. An empty value is kept, where RocketMQ's Java reader
    drops it (string2messageProperties), so what we write reads back whole. Bytes are UTF-8
    with bad sequences replaced, like Java's ``new String(bytes, UTF_8)``."""
    text = raw if isinstance(raw, str) else str(raw, "utf-8", "replace")
    props: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if name and sep:
            props[name] = value
    return props


def encode_properties(props: dict[str, str]) -> str:
    """The string form of ``props``. RocketMQ ends every pair with ``\\x02``; we leave the last
    one out, because ali-ons turns a trailing separator into a property with an empty name,
    and every other reader takes both forms."""
    for name, value in props.items():
        if not name or NAME_VALUE_SEPARATOR in name or PROPERTY_SEPARATOR in name or PROPERTY_SEPARATOR in value:
            raise ValueError(f"property {name!r}={value!r} cannot be written with RocketMQ's separators")
    return PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items()])


# -- batch bodies --------------------------------------------------------------------------
# totalSize, magic, bodyCRC, flag, body length: clients write 0 for magic and CRC
_BATCH_HEAD = struct.Struct(">iiiii")
_I16 = struct.Struct(">h")


@dataclass(slots=True)
class BatchItem:
    """One message of a batch: only its flag, body and properties travel (the header has the
    rest). ``properties`` is the raw string form; ``decode_properties`` reads it."""

    flag: int
    body: bytes
    properties: str = ""


def encode_batch_body(items: list[BatchItem]) -> bytes:
    """What a producer sends as a SEND_BATCH_MESSAGE body (MessageDecoder.encodeMessages)."""
    parts: list[bytes] = []
    for item in items:
        props = item.properties.encode()
        if len(props) > 0x7FFF:
            raise ValueError(f"properties of {len(props)} bytes do not fit their 16-bit length")
        total = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts += (_BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)), item.body, _I16.pack(len(props)), props)
    return b"".join(parts)


def decode_batch_body(data: bytes | memoryview) -> list[BatchItem]:
    """The messages of a batch body. Like the broker (MessageExtEncoder.encodeBatch), it reads
    the fields in sequence and ignores totalSize, magic code and body CRC, which clients fill
    as they please; lengths that run past the body raise ``RemotingProtocolError``."""
    items = []
    at, end = 0, len(data)
    while at < end:
        if at + _BATCH_HEAD.size > end:
            raise RemotingProtocolError(f"batch message at byte {at} is truncated in its header")
        _total, _magic, _crc, flag, body_length = _BATCH_HEAD.unpack_from(data, at)
        body_at = at + _BATCH_HEAD.size
        props_length_at = body_at + body_length
        if body_length < 0 or props_length_at + 2 > end:
            raise RemotingProtocolError(f"batch message at byte {at}: body length {body_length} runs past the body")
        (props_length,) = _I16.unpack_from(data, props_length_at)
        props_at = props_length_at + 2
        if props_length < 0 or props_at + props_length > end:
            raise RemotingProtocolError(f"batch message at byte {at}: properties length {props_length} "
                                        "runs past the body")
        items.append(BatchItem(flag, bytes(data[body_at:props_length_at]),
                               str(data[props_at:props_at + props_length], "utf-8", "replace")))
        at = props_at + props_length
    return items
