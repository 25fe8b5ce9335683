"""The stored-message layout that pull, query and view replies carry: what RocketMQ's
MessageDecoder.decode reads, so real clients decode the messages we hand them.

    TOTALSIZE i32 | MAGICCODE i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
    PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST ip + i32 port |
    STORETIMESTAMP i64 | STOREHOST ip + i32 port | RECONSUMETIMES i32 |
    PREPAREDTRANSACTIONOFFSET i64 | BODY i32 len + bytes | TOPIC i8 len + bytes |
    PROPERTIES i16 len + bytes

We write magic code v1 (topic length in one signed byte, so topics of at most 127 bytes: what
clients can read) and IPv4 hosts. Reading also takes v2 (i16 topic length) and IPv6 hosts
(16-byte addresses, flagged in sysFlag). A message's id is its offsetMsgId: store host, port
and commitlog offset in upper-case hex.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass, field

from .errors import RemotingProtocolError
from .properties import decode_properties, encode_properties

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7 as an i32: v1, one-byte topic length
MESSAGE_MAGIC_CODE_V2 = -626843477  # 0xDAA320AB: two-byte topic length (brokers' long topics)
MAX_TOPIC_BYTES = 127

# MessageSysFlag bits
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC  # also the mask of the two transaction bits
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
STOREHOST_V6_FLAG = STOREHOSTADDRESS_V6_FLAG
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_MASK = 0x700  # LZ4 0x100, ZSTD 0x200, ZLIB 0x300; no bits: zlib

_HEAD = struct.Struct(">iiiiiqqiq")  # totalSize .. bornTimestamp
_TAIL = struct.Struct(">iqi")  # reconsumeTimes, preparedTransactionOffset, body length
_V4_FIXED = struct.Struct(">iiiiiqqiq4siq4siiqi")  # all fixed fields of an IPv4 message
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_ID = struct.Struct(">iq")  # port and offset of an offsetMsgId
_HEX = re.compile("[0-9A-Fa-f]+")
MIN_MESSAGE_SIZE = _V4_FIXED.size + 1 + 2


@dataclass(slots=True)
class WireMessage:
    """One message as a pull reply carries it. Hosts are raw address bytes (4 for IPv4)."""

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

    @property
    def msg_id(self) -> str:
        """The offsetMsgId clients give this message (MessageExt.getMsgId on the Java side)."""
        return offset_msg_id(self.store_host, self.store_port, self.commit_log_offset)


def body_crc(body: bytes | memoryview) -> int:
    """RocketMQ's UtilAll.crc32: java.util.zip.CRC32 (= zlib's) with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_message(m: WireMessage) -> bytes:
    """The v1 bytes of ``m``; ValueError for what RocketMQ clients could not read back."""
    topic = m.topic.encode()
    props = encode_properties(m.properties).encode()
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"a topic of {len(topic)} bytes does not fit the v1 message layout (max 127)")
    if len(props) > 0x7FFF:
        raise ValueError(f"message properties of {len(props)} bytes exceed 32767")
    if len(m.born_host) != 4 or len(m.store_host) != 4:
        raise ValueError("hosts must be 4-byte IPv4 addresses")
    total = _V4_FIXED.size + len(m.body) + 1 + len(topic) + 2 + len(props)
    try:
        fixed = _V4_FIXED.pack(
            total, MESSAGE_MAGIC_CODE, body_crc(m.body), m.queue_id, _i32(m.flag), m.queue_offset,
            m.commit_log_offset, m.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG), m.born_timestamp,
            m.born_host, m.born_port, m.store_timestamp, m.store_host, m.store_port, m.reconsume_times,
            m.prepared_transaction_offset, len(m.body))
    except struct.error as exc:
        raise ValueError(f"a message field is out of range: {exc}") from None
    return b"".join((fixed, m.body, bytes((len(topic),)), topic, _I16.pack(len(props)), props))


def _i32(value: int) -> int:
    """An int as Java holds it: flags are bit sets, so 0xFFFFFFFF means -1."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def decode_messages(data: bytes | memoryview, *, check_crc: bool = False) -> list[WireMessage]:
    """The messages of a pull (or query/view) reply body, for tests and the gateway's own
    clients. Each message must end exactly where its TOTALSIZE says."""
    view = memoryview(data)
    messages = []
    at, end = 0, len(view)
    while at < end:
        if at + _HEAD.size > end:
            raise RemotingProtocolError(f"message at byte {at} is truncated")
        (total, magic, crc, queue_id, flag, queue_offset, commit_log_offset, sys_flag,
         born_ts) = _HEAD.unpack_from(view, at)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
            raise RemotingProtocolError(f"message at byte {at} has magic code {magic & 0xFFFFFFFF:#x}")
        if total < MIN_MESSAGE_SIZE or at + total > end:
            raise RemotingProtocolError(f"message at byte {at} has total size {total} ({end - at} bytes left)")
        m = view[at:at + total]  # every read below is bounded by this message
        try:
            p = _HEAD.size
            born_host, born_port, p = _host(m, p, sys_flag & BORNHOST_V6_FLAG)
            (store_ts,) = _I64.unpack_from(m, p)
            store_host, store_port, p = _host(m, p + 8, sys_flag & STOREHOSTADDRESS_V6_FLAG)
            reconsume, prepared, body_len = _TAIL.unpack_from(m, p)
            p += _TAIL.size
            if body_len < 0 or p + body_len > total:
                raise RemotingProtocolError(f"message at byte {at}: body length {body_len} runs past the message")
            body = bytes(m[p:p + body_len])
            p += body_len
            if magic == MESSAGE_MAGIC_CODE:
                (topic_len,) = _I8.unpack_from(m, p)  # a signed byte, as Java reads it
                p += 1
            else:
                (topic_len,) = _I16.unpack_from(m, p)
                p += 2
            if topic_len < 0 or p + topic_len > total:
                raise RemotingProtocolError(f"message at byte {at}: topic length {topic_len} runs past the message")
            topic = str(m[p:p + topic_len], "utf-8", "replace")
            p += topic_len
            (props_len,) = _I16.unpack_from(m, p)
            p += 2
        except struct.error:
            raise RemotingProtocolError(f"message at byte {at} is truncated") from None
        if props_len < 0 or p + props_len != total:
            raise RemotingProtocolError(f"message at byte {at}: its fields do not add up to total size {total}")
        if check_crc and body_crc(body) != crc:
            raise RemotingProtocolError(f"message at byte {at}: body CRC mismatch")
        messages.append(WireMessage(
            topic=topic, body=body, queue_id=queue_id, flag=flag, queue_offset=queue_offset,
            commit_log_offset=commit_log_offset, sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
            born_port=born_port, store_timestamp=store_ts, store_host=store_host, store_port=store_port,
            reconsume_times=reconsume, prepared_transaction_offset=prepared,
            properties=decode_properties(m[p:total])))
        at += total
    return messages


def with_store_host(data: bytes, host: bytes, port: int) -> bytes:
    """The messages of a pull (or pop, query, view) reply body, each with ``host`` (4 bytes)
    and ``port`` as its store host, the address clients derive its offsetMsgId from; a message
    stored with an IPv6 store host keeps it. RemotingProtocolError for a body that does not
    frame."""
    out = bytearray(data)
    at, end = 0, len(out)
    while at < end:
        if at + _HEAD.size > end:
            raise RemotingProtocolError(f"message at byte {at} is truncated")
        total, magic, *_, sys_flag, _born = _HEAD.unpack_from(out, at)
        if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
            raise RemotingProtocolError(f"message at byte {at} has magic code {magic & 0xFFFFFFFF:#x}")
        if total < MIN_MESSAGE_SIZE or at + total > end:
            raise RemotingProtocolError(f"message at byte {at} has total size {total} ({end - at} bytes left)")
        if not sys_flag & STOREHOSTADDRESS_V6_FLAG:
            p = at + _HEAD.size + (20 if sys_flag & BORNHOST_V6_FLAG else 8) + 8  # (born host, store timestamp)
            if p + 8 > at + total:
                raise RemotingProtocolError(f"message at byte {at} is truncated")
            out[p:p + 4] = host
            _I32.pack_into(out, p + 4, port)
        at += total
    return bytes(out)


def with_msg_id_host(msg_id: str, host: bytes, port: int) -> str:
    """An offsetMsgId naming ``host`` and ``port`` instead of its own store host."""
    _, _, offset = decode_offset_msg_id(msg_id)
    return offset_msg_id(host, port, offset)


def _host(m: memoryview, p: int, v6: int) -> tuple[bytes, int, int]:
    """An address (16 bytes if flagged IPv6, else 4), its i32 port, and the position after."""
    size = 16 if v6 else 4
    if p + size > len(m):
        raise struct.error("host truncated")
    (port,) = _I32.unpack_from(m, p + size)
    return bytes(m[p:p + size]), port, p + size + 4


def offset_msg_id(store_host: bytes, port: int, commit_log_offset: int) -> str:
    """RocketMQ's offsetMsgId (MessageDecoder.createMessageId): store host address, port (i32)
    and commitlog offset (i64) as upper-case hex: 32 digits for IPv4, 56 for IPv6."""
    if len(store_host) not in (4, 16):
        raise ValueError("a store host is a 4- or 16-byte address")
    return (store_host + _ID.pack(port, commit_log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int, int]:
    """``(store host address, port, commitlog offset)`` of an offsetMsgId."""
    if len(msg_id) not in (32, 56) or not _HEX.fullmatch(msg_id):
        raise RemotingProtocolError(f"message id {msg_id!r} is not 32 (IPv4) or 56 (IPv6) hex digits")
    raw = bytes.fromhex(msg_id)
    port, offset = _ID.unpack_from(raw, len(raw) - _ID.size)
    return raw[:len(raw) - _ID.size], port, offset
