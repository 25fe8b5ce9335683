"""Remoting frames, sans-IO: ``length | type and header length | header | body``.

``length`` (i32, big endian) counts everything after itself. The next int holds the header's
serialize type in its high byte (0 JSON, 1 ROCKETMQ) and the header length in the low three.
A JSON header is RemotingCommand's fields as an object; the ROCKETMQ binary header is code
(u16), language (u8), version (u16), opaque and flag (i32), remark (i32 length + UTF-8) and
extFields (i32 total length, then per field u16 key length + key, i32 value length + value).
``encode`` turns a command into bytes; ``FrameReader`` is fed bytes and returns whole commands.
Replies keep the serialize type of their request: ali-ons and the C++ client read the whole
second int as the header length, so they only work because requests and replies stay JSON.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from .codes import LANGUAGE_CODES, LANGUAGES, LanguageCode, SerializeType
from .errors import FrameTooLarge, RemotingProtocolError

SERIALIZE_JSON = SerializeType.JSON
SERIALIZE_ROCKETMQ = SerializeType.ROCKETMQ
FLAG_RESPONSE = 0x1  # bit RPC_TYPE: set on responses
FLAG_ONEWAY = 0x2  # bit RPC_ONEWAY: the sender wants no response
SERVER_VERSION = 401  # MQVersion.Version.V4_9_4.ordinal(); clients keep it as the broker version
# RocketMQ's NettyDecoder limit (com.rocketmq.remoting.frameMaxLength), length prefix included
DEFAULT_MAX_FRAME = 16 << 20
MAX_HEADER_LENGTH = 0xFFFFFF

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">iI")  # length, serialize type << 24 | header length
# code, language, version, opaque, flag. Java reads code and version as signed shorts; no
# code or version in use reaches 32768, and the POP codes (200050...) travel only in JSON.
_BINARY_HEAD = struct.Struct(">HBHii")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` are the custom header's fields, all strings as
    on the wire; ``body`` is opaque bytes (JSON for most admin calls, messages for send/pull)."""

    # field order: the positional order callers already use (code, opaque, flag, ext, body)
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
    """The reply to ``request``: its opaque and serialize type, the response flag set. Replies
    say language JAVA, as every client has seen from RocketMQ's own brokers."""
    return RemotingCommand(int(code), language="JAVA", version=SERVER_VERSION, opaque=request.opaque,
                           flag=FLAG_RESPONSE, remark=remark, ext_fields=ext_fields or {}, body=body,
                           serialize_type=request.serialize_type)


# -- encoding ------------------------------------------------------------------------------
def encode(command: RemotingCommand) -> bytes:
    """The whole frame of ``command``. Raises ValueError for what the wire cannot carry."""
    return encode_head(command) + command.body


def encode_head(command: RemotingCommand) -> bytes:
    """The frame without its body (``encode(c) == encode_head(c) + c.body``), so a large body
    can be written after it without being copied into one buffer."""
    kind = command.serialize_type
    if kind == SERIALIZE_JSON:
        header = _encode_json_header(command)
    elif kind == SERIALIZE_ROCKETMQ:
        header = _encode_binary_header(command)
    else:
        raise ValueError(f"unknown serialize type {kind}")
    if len(header) > MAX_HEADER_LENGTH:
        raise ValueError(f"a header of {len(header)} bytes does not fit the 24-bit header length")
    length = 4 + len(header) + len(command.body)
    if length > _I32_MAX:
        raise ValueError(f"a frame of {length} bytes does not fit the 32-bit length")
    return _FRAME_HEAD.pack(length, (kind << 24) | len(header)) + header


def _wire_text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _encode_json_header(command: RemotingCommand) -> bytes:
    ext = command.ext_fields
    if not all(type(v) is str for v in ext.values()):  # Go's client decodes map[string]string
        ext = {k: _wire_text(v) for k, v in ext.items()}
    doc: dict[str, Any] = {"code": command.code, "language": command.language, "version": command.version,
                           "opaque": command.opaque, "flag": command.flag}
    if command.remark is not None:  # fastjson leaves nulls out; every client takes a missing remark
        doc["remark"] = command.remark
    doc["extFields"] = ext  # always there: Java clients read send/heartbeat replies' map unchecked
    doc["serializeTypeCurrentRPC"] = "JSON"
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _encode_binary_header(command: RemotingCommand) -> bytes:
    for name in ("code", "version"):
        value = getattr(command, name)
        if not 0 <= value <= 0xFFFF:
            raise ValueError(f"{name} {value} does not fit the ROCKETMQ header's 16 bits")
    remark = command.remark.encode() if command.remark else b""
    parts: list[bytes] = []
    for key, value in command.ext_fields.items():
        k, v = key.encode(), _wire_text(value).encode()
        if len(k) > 0x7FFF:
            raise ValueError(f"extFields key of {len(k)} bytes is too long for the ROCKETMQ header")
        parts += (_U16.pack(len(k)), k, _I32.pack(len(v)), v)
    ext = b"".join(parts)
    language = LANGUAGE_CODES.get(command.language, LanguageCode.OTHER)
    try:
        head = _BINARY_HEAD.pack(command.code, language, command.version, command.opaque, command.flag)
    except struct.error as exc:  # opaque or flag outside Java's int
        raise ValueError(f"the ROCKETMQ header cannot carry {command!r}: {exc}") from None
    return b"".join((head, _I32.pack(len(remark)), remark, _I32.pack(len(ext)), ext))


# -- decoding ------------------------------------------------------------------------------
def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """One command from a frame without its length prefix (type/length int, header, body)."""
    if len(frame) < 4:
        raise RemotingProtocolError(f"a frame of {len(frame)} bytes has no header length")
    (word,) = _U32.unpack_from(frame, 0)
    kind, header_length = word >> 24, word & MAX_HEADER_LENGTH
    if header_length > len(frame) - 4:
        raise RemotingProtocolError(f"header length {header_length} exceeds the frame ({len(frame) - 4} bytes)")
    header = frame[4:4 + header_length]
    if kind == SERIALIZE_JSON:
        command = _decode_json_header(header)
    elif kind == SERIALIZE_ROCKETMQ:
        command = _decode_binary_header(header)
    else:
        raise RemotingProtocolError(f"unknown serialize type {kind}")
    command.body = bytes(frame[4 + header_length:])
    return command


def _json_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _decode_json_header(header: bytes | memoryview) -> RemotingCommand:
    try:
        text = str(header, "utf-8")
        doc = json.loads(text, parse_constant=_json_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise RemotingProtocolError(f"the JSON header does not parse: {exc}") from None
    if not isinstance(doc, dict):
        raise RemotingProtocolError("the JSON header is not an object")
    ext = doc.get("extFields")
    if ext is None:
        ext = {}
    elif not isinstance(ext, dict):
        raise RemotingProtocolError("extFields is not an object")
    remark = doc.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise RemotingProtocolError(f"remark is not a string: {remark!r}")
    command = RemotingCommand(
        _json_int(doc, "code"), language=_json_language(doc.get("language")), version=_json_int(doc, "version"),
        opaque=_json_int(doc, "opaque"), flag=_json_int(doc, "flag"), remark=remark,
        ext_fields={k: _ext_text(k, v) for k, v in ext.items() if v is not None},  # null: the field is absent
        serialize_type=SERIALIZE_JSON)
    if "\\u" in text:
        _refuse_lone_surrogates(command)
    return command


def _json_int(doc: dict[str, Any], name: str) -> int:
    value = doc.get(name, 0)
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):  # fastjson takes "12" for an int
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not _I32_MIN <= value <= _I32_MAX:
        raise RemotingProtocolError(f"header field {name} is not a 32-bit integer: {value!r}")
    return value


def _json_language(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(LANGUAGES):
        return LANGUAGES[value]  # fastjson also reads an enum from its ordinal
    return "JAVA" if value is None else "OTHER"


def _ext_text(key: str, value: object) -> str:
    """extFields values are strings for Java, but JavaScript clients send numbers and booleans
    as such; all become what Java's toString gives."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise RemotingProtocolError(f"extFields value of {key!r} is a {type(value).__name__}")


def _refuse_lone_surrogates(command: RemotingCommand) -> None:
    """A \\ud800-style escape decodes to a string no UTF-8 encoder (nor store) accepts."""
    try:
        for text in (command.language, command.remark or "", *command.ext_fields, *command.ext_fields.values()):
            text.encode()
    except UnicodeEncodeError:
        raise RemotingProtocolError("the JSON header holds an unpaired surrogate escape") from None


def _decode_binary_header(header: bytes | memoryview) -> RemotingCommand:
    end = len(header)
    if end < _BINARY_HEAD.size + 8:
        raise RemotingProtocolError(f"a ROCKETMQ header of {end} bytes is truncated")
    code, language, version, opaque, flag = _BINARY_HEAD.unpack_from(header, 0)
    at = _BINARY_HEAD.size
    remark_bytes, at = _sized(header, at, _I32, end, "the remark")
    if at + 4 > end:
        raise RemotingProtocolError("the ROCKETMQ header is truncated in the extFields length")
    (ext_length,) = _I32.unpack_from(header, at)
    at += 4
    if ext_length < 0 or at + ext_length != end:
        raise RemotingProtocolError(f"extFields length {ext_length} does not match the header "
                                    f"({end - at} bytes left)")
    ext: dict[str, str] = {}
    while at < end:
        key, at = _sized(header, at, _I16, end, "an extFields key")
        value, at = _sized(header, at, _I32, end, "an extFields value")
        ext[_utf8(key, "an extFields key")] = _utf8(value, "an extFields value")
    return RemotingCommand(
        code, language=LANGUAGES[language] if language < len(LANGUAGES) else "OTHER", version=version,
        opaque=opaque, flag=flag, remark=_utf8(remark_bytes, "the remark") or None, ext_fields=ext,
        serialize_type=SERIALIZE_ROCKETMQ)


def _sized(data: bytes | memoryview, at: int, prefix: struct.Struct, end: int,
           what: str) -> tuple[bytes | memoryview, int]:
    """A length-prefixed field at ``at`` and the position after it; bounds checked against ``end``."""
    if at + prefix.size > end:
        raise RemotingProtocolError(f"the ROCKETMQ header is truncated in {what}")
    (length,) = prefix.unpack_from(data, at)
    at += prefix.size
    if length < 0 or at + length > end:
        raise RemotingProtocolError(f"{what} of length {length} runs past the header")
    return data[at:at + length], at + length


def _utf8(raw: bytes | memoryview, what: str) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        raise RemotingProtocolError(f"{what} is not UTF-8") from None


class FrameReader:
    """Feed bytes as they arrive, get the commands whose frames are complete.

    A length prefix is checked as soon as its four bytes are in: a frame longer than
    ``max_frame_size`` (counted with its prefix, as RocketMQ's decoder does) raises
    ``FrameTooLarge`` before any of its body is buffered. After an error the stream cannot be
    resynchronised: every later ``feed`` raises too.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._needed = 4  # buffered bytes before the next frame can be decoded
        self._failed: RemotingProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame waiting for the rest."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        if self._failed is not None:
            raise RemotingProtocolError(f"the stream is unusable after an earlier error: {self._failed}")
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._needed:
                return []
            source = bytes(buffer)
            buffer.clear()
        else:
            source = data if isinstance(data, bytes) else bytes(data)
        view = memoryview(source)
        commands = []
        pos, size = 0, len(source)
        try:
            while size - pos >= 4:
                (length,) = _I32.unpack_from(source, pos)
                if length < 4:
                    raise RemotingProtocolError(f"frame length {length} is shorter than its header length int")
                if length + 4 > self.max_frame_size:
                    raise FrameTooLarge(f"a frame of {length + 4} bytes exceeds the limit of {self.max_frame_size}")
                end = pos + 4 + length
                if end > size:
                    self._needed = end - pos
                    break
                commands.append(decode_frame(view[pos + 4:end]))
                pos = end
            else:
                self._needed = 4
        except RemotingProtocolError as exc:
            self._failed = exc
            raise
        if pos < size:
            buffer += view[pos:]
        return commands
