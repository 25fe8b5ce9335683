"""Message properties as RocketMQ carries them (``name \\x01 value \\x02`` pairs), the
well-known property names (MessageConst), and the body of SEND_BATCH_MESSAGE: messages
back to back as MessageDecoder.encodeMessage writes them."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from .errors import RemotingProtocolError

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"
DELAY = "DELAY"
RETRY_TOPIC = "RETRY_TOPIC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QUEUE_ID = "REAL_QID"
TRANSACTION_PREPARED = "TRAN_MSG"
PRODUCER_GROUP = "PGROUP"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUME_TIME = "RECONSUME_TIME"
UNIQ_KEY = "UNIQ_KEY"  # PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: the client-made message id
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME = "CONSUME_START_TIME"
KEY_SEPARATOR = " "


def decode_properties(raw: str | bytes) -> dict[str, str]:
    text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else raw
    props: dict[str, str] = {}
    for pair in text.split(PROPERTY_SEPARATOR):
        if not pair:
            continue
        name, sep, value = pair.partition(NAME_VALUE_SEPARATOR)
        if sep:
            props[name] = value
    return props


def encode_properties(props: dict[str, str]) -> str:
    """No separator after the last pair: some clients (ali-ons) read one as an empty property."""
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())


# -- batch bodies --------------------------------------------------------------------------
_BATCH_HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body length


@dataclass(slots=True)
class BatchItem:
    body: bytes
    properties: str = ""
    flag: int = 0
    extra: dict[str, str] = field(default_factory=dict)


def body_crc(body: bytes) -> int:
    """UtilAll.crc32: CRC-32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_batch_body(items: list[BatchItem]) -> bytes:
    parts = []
    for item in items:
        props = item.properties.encode()
        total = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts.append(_BATCH_HEAD.pack(total, 0, body_crc(item.body), item.flag, len(item.body)) + item.body
                     + struct.pack(">H", len(props)) + props)
    return b"".join(parts)


def decode_batch_body(data: bytes) -> list[BatchItem]:
    items = []
    at = 0
    while at < len(data):
        try:
            total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, at)
        except struct.error:
            raise RemotingProtocolError("batch body truncated in a message header") from None
        end = at + total
        body_at = at + _BATCH_HEAD.size
        if total < _BATCH_HEAD.size + 2 or end > len(data) or body_len < 0 or body_at + body_len + 2 > end:
            raise RemotingProtocolError(f"batch message at byte {at} has inconsistent lengths")
        body = data[body_at:body_at + body_len]
        (props_len,) = struct.unpack_from(">H", data, body_at + body_len)
        props_at = body_at + body_len + 2
        if props_at + props_len > end:
            raise RemotingProtocolError(f"batch message at byte {at}: properties run past the message")
        try:
            props = data[props_at:props_at + props_len].decode()
        except UnicodeDecodeError:
            raise RemotingProtocolError(f"batch message at byte {at}: properties are not UTF-8") from None
        items.append(BatchItem(body, props, flag))
        at = end
    return items
