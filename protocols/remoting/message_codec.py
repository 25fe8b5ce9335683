"""The stored-message layout pull, query and view responses carry: what RocketMQ's
MessageDecoder.decode reads, so real clients decode our messages.

    TOTALSIZE i32 | MAGICCODE i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
    PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 4+4 | STORETIMESTAMP i64 |
    STOREHOST 4+4 | RECONSUMETIMES i32 | PREPAREDTRANSACTIONOFFSET i64 |
    BODY i32 len + bytes | TOPIC u8 len + bytes | PROPERTIES i16 len + bytes

Hosts are IPv4 (4 bytes and an i32 port); the sysFlag bits that would announce IPv6 hosts
are never set. Message ids are offsetMsgId: store host, port and commitlog offset in hex.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .errors import RemotingProtocolError
from .properties import body_crc, decode_properties, encode_properties

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as an i32
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20

_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")  # up to and including the body length


@dataclass(slots=True)
class WireMessage:
    topic: str
    body: bytes
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01"
    born_port: int = 0
    store_timestamp: int = 0
    store_host: bytes = b"\x7f\x00\x00\x01"
    store_port: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)


def encode_message(m: WireMessage) -> bytes:
    topic = m.topic.encode()
    props = encode_properties(m.properties).encode()
    if len(topic) > 255:
        raise ValueError("a topic name is at most 255 bytes")
    if len(props) > 32767:
        raise ValueError("message properties exceed 32767 bytes")
    total = _FIXED.size + len(m.body) + 1 + len(topic) + 2 + len(props)
    return b"".join((
        _FIXED.pack(total, MESSAGE_MAGIC_CODE, body_crc(m.body), m.queue_id, _i32(m.flag), m.queue_offset,
                    m.commit_log_offset, m.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG), m.born_timestamp,
                    m.born_host, m.born_port, m.store_timestamp, m.store_host, m.store_port, m.reconsume_times,
                    m.prepared_transaction_offset, len(m.body)),
        m.body,
        bytes((len(topic),)), topic,
        struct.pack(">h", len(props)), props,
    ))


def _i32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def decode_messages(data: bytes) -> list[WireMessage]:
    """The messages of a pull body (for tests and the gateway's own clients)."""
    messages = []
    at = 0
    while at < len(data):
        try:
            (total, magic, _crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts, born_host,
             born_port, store_ts, store_host, store_port, reconsume, prepared, body_len) = _FIXED.unpack_from(data, at)
        except struct.error:
            raise RemotingProtocolError(f"message at byte {at} is truncated") from None
        if magic != MESSAGE_MAGIC_CODE:
            raise RemotingProtocolError(f"message at byte {at} has magic {magic & 0xFFFFFFFF:#x}")
        if sys_flag & (BORNHOST_V6_FLAG | STOREHOST_V6_FLAG):
            raise RemotingProtocolError("IPv6 hosts are not supported")
        end = at + total
        p = at + _FIXED.size
        if total < _FIXED.size or end > len(data) or body_len < 0 or p + body_len + 1 > end:
            raise RemotingProtocolError(f"message at byte {at} has inconsistent lengths")
        body = data[p:p + body_len]
        p += body_len
        topic_len = data[p]
        topic = data[p + 1:p + 1 + topic_len].decode("utf-8", "replace")
        p += 1 + topic_len
        (props_len,) = struct.unpack_from(">h", data, p)
        props = decode_properties(data[p + 2:p + 2 + props_len])
        messages.append(WireMessage(topic, body, queue_id, flag, queue_offset, commit_log_offset, sys_flag, born_ts,
                                    born_host, born_port, store_ts, store_host, store_port, reconsume, prepared,
                                    props))
        at = end
    return messages


def offset_msg_id(host: bytes, port: int, commit_log_offset: int) -> str:
    """RocketMQ's offsetMsgId: 32 upper-case hex digits of IPv4, port and commitlog offset."""
    return (host + struct.pack(">iq", port, commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RemotingProtocolError(f"message id {msg_id!r} is not hex") from None
    if len(raw) != 16:
        raise RemotingProtocolError(f"message id {msg_id!r} is not 32 hex digits (IPv4 form)")
    port, offset = struct.unpack(">iq", raw[4:])
    return raw[:4], port, offset
