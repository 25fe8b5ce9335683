"""The send-time stamps the load generators put in their payloads, for every protocol: a payload
starts with (publisher index, sequence number, send time); ``StampedFrames`` writes them into
copies of one pre-encoded frame, ``StampLog`` reads them back into latencies, duplicates and
losses, and ``latency_result`` is what a receiving worker reports of them."""

from __future__ import annotations

import struct
from array import array
from typing import Any

PAYLOAD_SIZE = 64
# A payload starts with the publisher's index, its sequence number and the send time from
# CLOCK_MONOTONIC (time.monotonic_ns), which is one clock for every process on Linux.
STAMP = struct.Struct(">IIQ")
LATENCY_SAMPLES = 200_000  # per receiving process, taken evenly over the run


class StampedFrames:
    """``capacity`` copies of one pre-encoded frame whose payload starts at ``offset``; ``stamp``
    fills in sequence numbers and the send time in place, one pack_into per message."""

    __slots__ = ("buffer", "capacity", "frame_size", "offset", "publisher", "view")

    def __init__(self, frame: bytes, offset: int, publisher: int, capacity: int) -> None:
        self.publisher = publisher
        self.capacity = capacity
        self.frame_size = len(frame)
        self.offset = offset
        self.buffer = bytearray(frame * capacity)
        self.view = memoryview(self.buffer)

    def stamp(self, first_seq: int, count: int, now_ns: int) -> memoryview:
        buf, size, off, pub = self.buffer, self.frame_size, self.offset, self.publisher
        pack = STAMP.pack_into
        for seq in range(first_seq, first_seq + count):
            pack(buf, off, pub, seq, now_ns)
            off += size
        return self.view[: count * size]


class StampLog:
    """What a receiver saw of the stamps: messages received, duplicates (each (publisher,
    sequence) is marked once), and the send-to-receive latencies in nanoseconds."""

    __slots__ = ("duplicates", "latencies", "received", "seen")

    def __init__(self) -> None:
        self.received = 0
        self.duplicates = 0
        self.seen: dict[int, bytearray] = {}  # publisher index -> one byte per sequence number
        self.latencies = array("q")  # nanoseconds, in arrival order

    @property
    def unique(self) -> int:
        return self.received - self.duplicates

    def _marks(self, publisher: int, end: int) -> bytearray:
        """The seen-marks of ``publisher``, long enough for sequence numbers below ``end``."""
        marks = self.seen.get(publisher)
        if marks is None:
            marks = self.seen[publisher] = bytearray(65536)
        if end > len(marks):
            marks.extend(bytes(end + 65536 - len(marks)))
        return marks

    def take(self, buf: bytes | bytearray, offset: int, now_ns: int) -> None:
        """One message whose stamp sits at ``offset`` in ``buf``, received at ``now_ns``."""
        publisher, seq, sent_ns = STAMP.unpack_from(buf, offset)
        marks = self._marks(publisher, seq + 1)
        if marks[seq]:
            self.duplicates += 1
        else:
            marks[seq] = 1
        self.latencies.append(now_ns - sent_ns)
        self.received += 1


def latency_result(logs: list[StampLog]) -> dict[str, Any]:
    """A receiving worker's counts and latencies (at most LATENCY_SAMPLES, evenly taken) for
    ``harness.deliveries``."""
    latencies = array("q")
    for log in logs:
        latencies.extend(log.latencies)
    if len(latencies) > LATENCY_SAMPLES:
        latencies = latencies[:: len(latencies) // LATENCY_SAMPLES + 1]
    return {
        "unique": sum(log.unique for log in logs),
        "duplicates": sum(log.duplicates for log in logs),
        "latencies": latencies.tobytes(),
    }
