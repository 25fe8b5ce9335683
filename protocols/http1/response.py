"""The answers to requests sent on one HTTP/1.1 connection, read from the bytes that come back:
``ResponseReader.feed`` returns each answer once its body has been read (and skipped: the
client wants the status), interim (1xx) answers passed over; a body framed by the connection's
end is complete at ``closed``."""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD = 65_536  # bytes of a status line and headers
MAX_CHUNK_LINE = 4096


class ResponseError(Exception):
    """The peer's bytes are not an HTTP/1.1 answer (the connection cannot be used again)."""


@dataclass(slots=True, frozen=True)
class Answer:
    """A complete answer: its status, and whether the connection ends with it (``Connection:
    close``, HTTP/1.0, or a body framed by the connection's end)."""

    status: int
    closes: bool


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE = range(7)


class ResponseReader:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._state = _HEAD
        self._left = 0  # body or chunk bytes still to skip
        self._status = 0
        self._closes = False

    @property
    def idle(self) -> bool:
        """No byte of an answer has been read since the last complete one."""
        return self._state == _HEAD and not self._buffer

    def feed(self, data: bytes) -> list[Answer]:
        """The answers ``data`` completes (ResponseError: not HTTP/1.1)."""
        self._buffer += data
        answers: list[Answer] = []
        while True:
            answer, progressed = self._step()
            if answer is not None:
                answers.append(answer)
            if not progressed:
                return answers

    def closed(self) -> Answer | None:
        """The peer closed the connection: the answer this completes (its body ran to the end),
        if one was being read that way."""
        if self._state == _UNTIL_CLOSE:
            self._state = _HEAD
            return Answer(self._status, True)
        return None

    def _step(self) -> tuple[Answer | None, bool]:
        """One step of reading: the answer it completed, if any, and whether it read anything."""
        buffer = self._buffer
        state = self._state
        if state == _HEAD:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD:
                    raise ResponseError(f"no end of the answer's head in {MAX_HEAD} bytes")
                return None, False
            head = bytes(buffer[:end])
            del buffer[:end + 4]
            return self._head(head), True
        if state in (_LENGTH, _CHUNK_DATA, _UNTIL_CLOSE):
            if state == _UNTIL_CLOSE:
                buffer.clear()
                return None, False
            taken = min(self._left, len(buffer))
            del buffer[:taken]
            self._left -= taken
            if self._left:
                return None, False
            if state == _LENGTH:
                return self._done(), True
            self._state = _CHUNK_END
            return None, True
        if state == _CHUNK_END:
            if len(buffer) < 2:
                return None, False
            if buffer[:2] != b"\r\n":
                raise ResponseError("a chunk's data is not followed by CRLF")
            del buffer[:2]
            self._state = _CHUNK_SIZE
            return None, True
        end = buffer.find(b"\r\n")
        if end < 0:
            if len(buffer) > (MAX_HEAD if state == _TRAILERS else MAX_CHUNK_LINE):
                raise ResponseError("a chunk's line is too long")
            return None, False
        line = bytes(buffer[:end])
        del buffer[:end + 2]
        if state == _TRAILERS:
            return (self._done(), True) if not line else (None, True)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ResponseError(f"a chunk size that is not one: {line[:40]!r}") from None
        if size < 0:
            raise ResponseError("a negative chunk size")
        self._left = size
        self._state = _CHUNK_DATA if size else _TRAILERS
        return None, True

    def _head(self, head: bytes) -> Answer | None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or len(status_line[1]) != 3 \
                or not status_line[1].isdigit():
            raise ResponseError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
        status = int(status_line[1])
        if 100 <= status < 200 and status != 101:  # (an interim answer: the final one follows)
            return None
        if status == 101:
            raise ResponseError("the server switched protocols")
        closes = status_line[0] == b"HTTP/1.0"
        length: int | None = None
        coding: bytes | None = None  # the last transfer coding
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ResponseError(f"a header line without a colon: {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise ResponseError(f"a Content-Length that is not one: {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                coding = value.lower().rsplit(b",", 1)[-1].strip()
            elif name == b"connection":
                tokens = {token.strip() for token in value.lower().split(b",")}
                closes = b"close" in tokens or (closes and b"keep-alive" not in tokens)
        self._status, self._closes = status, closes
        if status in (204, 304):
            return self._done()
        if coding == b"chunked":
            self._state = _CHUNK_SIZE
        elif length is not None and coding is None:
            self._left = length
            self._state = _LENGTH
            if not length:
                return self._done()
        else:  # (a body that runs to the connection's end)
            self._state = _UNTIL_CLOSE
            self._closes = True
        return None

    def _done(self) -> Answer:
        self._state = _HEAD
        return Answer(self._status, self._closes)
