"""The store's public records: what a producer hands in, what a put returns, what a read returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .message import Message  # (compiled: one per message stored)
from ..log.record import decode_properties, decode_queues
from .put_result import PutResult  # (compiled: one per message stored)
from .stored_message import StoredMessage  # (compiled: one per message read)

TAGS_PROPERTY = "TAGS"  # RocketMQ's property name; the tag hash of an entry is computed from it


def tag_hash(tags: str | None) -> int:
    """Java's ``String.hashCode`` of the tags, as RocketMQ keeps it in consume-queue entries."""
    if not tags:
        return 0
    h = 0
    raw = tags.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class GetStatus(enum.Enum):
    FOUND = "found"
    NO_NEW_MESSAGE = "no_new_message"  # offset == max offset: nothing yet
    OFFSET_OVERFLOW = "offset_overflow"  # offset > max offset
    OFFSET_TOO_SMALL = "offset_too_small"  # below the minimum: retention removed it
    NO_SUCH_QUEUE = "no_such_queue"
    NO_MATCHED_MESSAGE = "no_matched_message"  # a filtered get scanned entries, none matched


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    messages: list[StoredMessage]
    next_offset: int  # where the reader should continue
    min_offset: int
    max_offset: int
