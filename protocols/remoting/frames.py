"""Remoting frames: ``length | serialize type + header length | header | body``.

``length`` (4 bytes, big endian) counts everything after itself. The next 4 bytes hold the
header's serialize type in the high byte (0 JSON, 1 ROCKETMQ) and the header length in the
low three. A JSON header is RemotingCommand's fields as an object; the ROCKETMQ binary header
is code (u16), language (u8), version (u16), opaque, flag (i32), remark and extFields with
length prefixes. Replies use the serialize type of their request (ali-ons reads the whole
second int as the header length, so a JSON reply must keep the high byte 0).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from .codes import LANGUAGE_CODES, LANGUAGES
from .errors import RemotingProtocolError

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
FLAG_RESPONSE = 0x1  # RPC_TYPE
FLAG_ONEWAY = 0x2  # RPC_ONEWAY
SERVER_VERSION = 399  # MQVersion V4_9_4: what the node announces in its replies
DEFAULT_MAX_FRAME = 16 << 20

_U32 = struct.Struct(">I")
_BINARY_HEAD = struct.Struct(">HBHii")


@dataclass(slots=True)
class RemotingCommand:
    code: int
    opaque: int = 0
    flag: int = 0
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    language: str = "PYTHON"
    version: int = SERVER_VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)


def response_to(request: RemotingCommand, code: int, remark: str | None = None,
                ext_fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
    """The reply to ``request``: same opaque and serialize type, the response flag set."""
    return RemotingCommand(int(code), request.opaque, FLAG_RESPONSE, ext_fields or {}, body, remark,
                           "JAVA", SERVER_VERSION, request.serialize_type)


# -- encoding ------------------------------------------------------------------------------
def encode(command: RemotingCommand) -> bytes:
    if command.serialize_type == SERIALIZE_ROCKETMQ:
        header = _encode_binary_header(command)
    else:
        header = json.dumps({
            "code": command.code, "language": command.language, "version": command.version,
            "opaque": command.opaque, "flag": command.flag, "remark": command.remark,
            "extFields": command.ext_fields, "serializeTypeCurrentRPC": "JSON",
        }, separators=(",", ":")).encode()
    body = command.body or b""
    return b"".join((
        _U32.pack(4 + len(header) + len(body)),
        _U32.pack((command.serialize_type << 24) | len(header)),
        header,
        body,
    ))


def _encode_binary_header(command: RemotingCommand) -> bytes:
    remark = (command.remark or "").encode()
    fields = []
    for key, value in command.ext_fields.items():
        k, v = key.encode(), str(value).encode()
        fields.append(struct.pack(">H", len(k)) + k + _U32.pack(len(v)) + v)
    ext = b"".join(fields)
    return b"".join((
        _BINARY_HEAD.pack(command.code, LANGUAGE_CODES.get(command.language, LANGUAGE_CODES["OTHER"]),
                          command.version, command.opaque, command.flag),
        _U32.pack(len(remark)), remark,
        _U32.pack(len(ext)), ext,
    ))


# -- decoding ------------------------------------------------------------------------------
def decode_frame(frame: bytes) -> RemotingCommand:
    """One frame without its leading length: the 4-byte type/length word, header, body."""
    if len(frame) < 4:
        raise RemotingProtocolError("frame shorter than its header length field")
    word = _U32.unpack_from(frame, 0)[0]
    serialize_type, header_length = word >> 24, word & 0xFFFFFF
    if header_length > len(frame) - 4:
        raise RemotingProtocolError(f"header length {header_length} exceeds the frame ({len(frame) - 4} bytes)")
    header = frame[4:4 + header_length]
    body = frame[4 + header_length:]
    if serialize_type == SERIALIZE_JSON:
        command = _decode_json_header(header)
    elif serialize_type == SERIALIZE_ROCKETMQ:
        command = _decode_binary_header(header)
    else:
        raise RemotingProtocolError(f"unknown serialize type {serialize_type}")
    command.body = body
    command.serialize_type = serialize_type
    return command


def _text(value: object) -> str:
    """extFields values arrive as strings, numbers or booleans: all become Java's toString."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    if value is None:
        return ""
    raise RemotingProtocolError(f"extFields value of type {type(value).__name__}")


def _int_field(doc: dict, name: str, default: int = 0) -> int:
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        raise RemotingProtocolError(f"header field {name} is not an integer: {value!r}")
    return value


def _decode_json_header(header: bytes) -> RemotingCommand:
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"JSON header does not parse: {exc}") from None
    if not isinstance(doc, dict):
        raise RemotingProtocolError("JSON header is not an object")
    ext = doc.get("extFields") or {}
    if not isinstance(ext, dict):
        raise RemotingProtocolError("extFields is not an object")
    remark = doc.get("remark")
    language = doc.get("language", "JAVA")
    return RemotingCommand(
        code=_int_field(doc, "code"), opaque=_int_field(doc, "opaque"), flag=_int_field(doc, "flag"),
        ext_fields={str(k): _text(v) for k, v in ext.items()},
        remark=None if remark is None else str(remark),
        language=language if isinstance(language, str) else "OTHER",
        version=_int_field(doc, "version"),
    )


def _decode_binary_header(header: bytes) -> RemotingCommand:
    try:
        code, language, version, opaque, flag = _BINARY_HEAD.unpack_from(header, 0)
        at = _BINARY_HEAD.size
        remark_len = _U32.unpack_from(header, at)[0]
        at += 4
        if at + remark_len > len(header):
            raise RemotingProtocolError("the remark runs past the header")
        remark = header[at:at + remark_len].decode() if remark_len else None
        at += remark_len
        ext_len = _U32.unpack_from(header, at)[0]
        at += 4
        end = at + ext_len
        if end > len(header):
            raise RemotingProtocolError("extFields run past the header")
        ext: dict[str, str] = {}
        while at < end:
            (key_len,) = struct.unpack_from(">H", header, at)
            at += 2
            key = header[at:at + key_len].decode()
            at += key_len
            (value_len,) = _U32.unpack_from(header, at)
            at += 4
            if at + value_len > end:
                raise RemotingProtocolError("an extFields value runs past the header")
            ext[key] = header[at:at + value_len].decode()
            at += value_len
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemotingProtocolError(f"binary header does not parse: {exc}") from None
    return RemotingCommand(code, opaque, flag, ext, b"", remark,
                           LANGUAGES[language] if language < len(LANGUAGES) else "OTHER", version)


class FrameReader:
    """Feed bytes, get the commands whose frames are complete. Lengths are checked before
    anything is buffered beyond them: a frame over ``max_frame_size`` is refused at once."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[RemotingCommand]:
        buf = self._buffer
        buf += data
        commands = []
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (length,) = _U32.unpack_from(buf, pos)
                if length < 4:
                    raise RemotingProtocolError(f"frame length {length} is shorter than its header length field")
                if length > self.max_frame_size:
                    raise RemotingProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame_size}")
                if len(buf) - pos - 4 < length:
                    break
                commands.append(decode_frame(bytes(buf[pos + 4:pos + 4 + length])))
                pos += 4 + length
        finally:
            del buf[:pos]
        return commands
