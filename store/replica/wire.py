"""The replication link's frames, sans-IO: bytes in, frames out, and frames to bytes.

A follower opens the link with HELLO (who it is, its epoch history and log end); the leader
answers WELCOME (its epoch, where the follower's log stops agreeing with its own, its epoch
history) or REFUSE (why). Then the leader sends DATA frames (commitlog bytes at a position,
under its epoch, with the confirmed position) and the follower ACK frames (how far it has
written and made durable). Every frame: u32 length of what follows, u8 kind, the fields.
Every DATA carries the leader's epoch: a follower refuses bytes from an epoch older than one it
has seen (the fencing token). A follower whose log the leader cannot stream to is answered with
a seed instead of WELCOME: SEED_FILE frames (its files, replica/seed.py), then SEED_DONE; it
installs them and says HELLO again.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .epochs import Epochs

MAX_FRAME = 64 << 20  # a DATA frame carries at most a few MiB; anything larger is not ours
PROTOCOL_VERSION = 1

_HEAD = struct.Struct(">IB")
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_HELLO = struct.Struct(">HQQQ")  # version, segment size, log end, log start
_WELCOME = struct.Struct(">QQQ")  # epoch, agreed end, leader's log start
_DATA = struct.Struct(">QQQ")  # epoch, position, confirmed
_ACK = struct.Struct(">QQ")  # written end, durable end


class WireError(Exception):
    """The peer sent bytes that are no frame of this protocol."""


@dataclass(slots=True, frozen=True)
class Hello:
    node: str
    token: str
    segment_size: int
    log_end: int
    log_start: int
    epochs: Epochs
    version: int = PROTOCOL_VERSION


@dataclass(slots=True, frozen=True)
class Welcome:
    epoch: int
    agreed_end: int  # the follower cuts its log here and receives from here
    log_start: int  # the leader's oldest position (a follower behind it must be seeded)
    epochs: Epochs


@dataclass(slots=True, frozen=True)
class Refuse:
    reason: str


@dataclass(slots=True, frozen=True)
class Data:
    epoch: int
    position: int
    confirmed: int  # the leader's confirmed position: what the in-sync replicas hold
    payload: bytes  # commitlog bytes from ``position``; empty: a heartbeat


@dataclass(slots=True, frozen=True)
class Ack:
    written: int
    durable: int


@dataclass(slots=True, frozen=True)
class SeedFile:
    name: str  # relative to the data directory: commitlog/..., index/..., meta/..., EPOCHS
    offset: int
    payload: bytes


@dataclass(slots=True, frozen=True)
class SeedDone:
    epoch: int
    end: int  # the commitlog position the seed reaches


Frame = Hello | Welcome | Refuse | Data | Ack | SeedFile | SeedDone
_KINDS: dict[type, int] = {Hello: 1, Welcome: 2, Refuse: 3, Data: 4, Ack: 5, SeedFile: 6, SeedDone: 7}
_SEED_FILE = struct.Struct(">Q")  # offset; then the name, then the bytes


def encode(frame: Frame) -> bytes:
    body = _encode_body(frame)
    return _HEAD.pack(len(body) + 1, _KINDS[type(frame)]) + body


def _encode_body(frame: Frame) -> bytes:
    if isinstance(frame, Data):
        return _DATA.pack(frame.epoch, frame.position, frame.confirmed) + frame.payload
    if isinstance(frame, Ack):
        return _ACK.pack(frame.written, frame.durable)
    if isinstance(frame, Hello):
        return (_HELLO.pack(frame.version, frame.segment_size, frame.log_end, frame.log_start)
                + _text(frame.node) + _text(frame.token) + _epochs(frame.epochs))
    if isinstance(frame, Welcome):
        return _WELCOME.pack(frame.epoch, frame.agreed_end, frame.log_start) + _epochs(frame.epochs)
    if isinstance(frame, SeedFile):
        return _SEED_FILE.pack(frame.offset) + _text(frame.name) + frame.payload
    if isinstance(frame, SeedDone):
        return _PAIR.pack(frame.epoch, frame.end)
    return _text(frame.reason)


class FrameReader:
    """Feed bytes as they arrive; ``frames()`` yields each whole frame once."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def frames(self, limit: int = 1 << 30) -> list[Frame]:
        """The whole frames fed so far, at most ``limit`` of them (the rest stay for the next call)."""
        out: list[Frame] = []
        buf = self._buffer
        at = 0
        while len(buf) - at >= _HEAD.size and len(out) < limit:
            length, kind = _HEAD.unpack_from(buf, at)
            if not 1 <= length <= MAX_FRAME:
                raise WireError(f"frame length {length} out of range")
            if len(buf) - at - 4 < length:
                break
            body = bytes(buf[at + _HEAD.size:at + 4 + length])
            out.append(_decode(kind, body))
            at += 4 + length
        del buf[:at]
        return out


def _decode(kind: int, body: bytes) -> Frame:
    try:
        if kind == 4:
            epoch, position, confirmed = _DATA.unpack_from(body)
            return Data(epoch, position, confirmed, body[_DATA.size:])
        if kind == 5:
            return Ack(*_ACK.unpack(body))
        if kind == 1:
            version, segment_size, log_end, log_start = _HELLO.unpack_from(body)
            node, at = _read_text(body, _HELLO.size)
            token, at = _read_text(body, at)
            epochs, at = _read_epochs(body, at)
            _at_end(body, at)
            return Hello(node, token, segment_size, log_end, log_start, epochs, version)
        if kind == 2:
            epoch, agreed, start = _WELCOME.unpack_from(body)
            epochs, at = _read_epochs(body, _WELCOME.size)
            _at_end(body, at)
            return Welcome(epoch, agreed, start, epochs)
        if kind == 3:
            reason, at = _read_text(body, 0)
            _at_end(body, at)
            return Refuse(reason)
        if kind == 6:
            (offset,) = _SEED_FILE.unpack_from(body)
            name, at = _read_text(body, _SEED_FILE.size)
            return SeedFile(name, offset, body[at:])
        if kind == 7:
            epoch, end = _PAIR.unpack(body)
            return SeedDone(epoch, end)
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"bad frame of kind {kind}: {exc}") from None
    raise WireError(f"unknown frame kind {kind}")


def _text(value: str) -> bytes:
    raw = value.encode()
    return _U64.pack(len(raw)) + raw


def _read_text(body: bytes, at: int) -> tuple[str, int]:
    (n,) = _U64.unpack_from(body, at)
    at += _U64.size
    if at + n > len(body):
        raise WireError("text runs past the frame")
    return body[at:at + n].decode(), at + n


def _epochs(entries: Epochs) -> bytes:
    return _U64.pack(len(entries)) + b"".join(_PAIR.pack(e, s) for e, s in entries)


def _read_epochs(body: bytes, at: int) -> tuple[Epochs, int]:
    (n,) = _U64.unpack_from(body, at)
    at += _U64.size
    if at + n * _PAIR.size > len(body):
        raise WireError("epoch list runs past the frame")
    entries = [_PAIR.unpack_from(body, at + i * _PAIR.size) for i in range(n)]
    return [(e, s) for e, s in entries], at + n * _PAIR.size


def _at_end(body: bytes, at: int) -> None:
    if at != len(body):
        raise WireError(f"{len(body) - at} bytes left over in a frame")
