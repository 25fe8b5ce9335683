"""The store's public records, one for each moment of a message's life, in RocketMQ's terms:
``Message``, what a producer hands in (its content, no place yet); ``PutResult``, the receipt
of a put (where the record went: position, size, store time, an offset per queue; no content);
``StoredMessage``, what a read returns (the content as stored, its place, and the one queue and
offset it was read through). ``GetResult`` is a queue read's answer."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocols.java_hash import string_hash

from .message import Message  # (compiled: one per message stored)
from ..log.record import decode_properties, decode_queues
from .put_result import PutResult  # (compiled: one per message stored)
from .stored_message import StoredMessage  # (compiled: one per message read)

TAGS_PROPERTY = "TAGS"  # RocketMQ's property name; the tag hash of an entry is computed from it


def tag_hash(tags: str | None) -> int:
    """Java's ``String.hashCode`` of the tags, as RocketMQ keeps it in consume-queue entries."""
    return string_hash(tags) if tags else 0


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
