"""The committer's per-message bookkeeping, compiled (sans-IO: no asyncio, no files): a message
encoded as far as it can be before it has queue offsets (``PreparedMessage``), a group's
offsets assigned and records framed (``place``), and what each put returns (``put_results``).

The committer (committer.py) runs these between its awaits; the dispatcher indexes what
``place`` returns once the records are in the commitlog.
"""

from __future__ import annotations

from time import time_ns
from collections.abc import Callable, Sequence

import cython

from .errors import InvalidMessageError, MessageTooLargeError
from .keyindex import key_prefixes
from .message import TAGS_PROPERTY, Message, PutResult, tag_hash
from .record import FIXED_SIZE, assemble, encode_properties, encode_static, queue_slots_of

QID_MASK = 0xFFFF_FFFF  # (the low half of a queue's packed state: consumequeue.pack_state)
OFFSET_STEP = 1 << 32  # one more offset in a packed state


@cython.cclass
class PreparedMessage:
    """A message encoded as far as it can be before the committer gives it queue offsets."""

    body = cython.declare(bytes, visibility="readonly")
    born = cython.declare(cython.longlong, visibility="readonly")
    flag = cython.declare(cython.uint, visibility="readonly")
    index_keys = cython.declare(tuple, visibility="readonly")
    queues = cython.declare(object, visibility="readonly")  # Sequence[str]
    size = cython.declare(cython.Py_ssize_t, visibility="readonly")
    slots = cython.declare(list, visibility="readonly")
    static = cython.declare(bytes, visibility="readonly")
    tag_hash = cython.declare(cython.longlong, visibility="readonly")

    def __init__(self, message: Message, queues: Sequence[str], max_size: int) -> None:
        if not queues:
            raise InvalidMessageError("a message needs at least one target queue")
        body = message.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessageError("message body must be bytes")
            body = bytes(body)
        props = message.properties
        encoded = message.encoded_properties
        if encoded is not None:
            props = None
        if message.tags:
            if encoded is not None:  # an encoding is a run of pairs: the tags pair can follow
                encoded += encode_properties({TAGS_PROPERTY: message.tags})
            else:
                props = {**(props or {}), TAGS_PROPERTY: message.tags}
            self.tag_hash = tag_hash(message.tags)
        else:
            self.tag_hash = 0
        slots, slots_len = queue_slots_of(queues)
        self.slots = slots
        self.static = encode_static(
            message.topic.encode(), message.key.encode() if message.key else b"",
            encoded if encoded is not None else encode_properties(props) if props else b"", len(queues), len(body),
        )
        self.body = body
        born = message.born_timestamp
        if born is None:  # the store's clock (a C division: ~50 ns less per message than on ints)
            now_ns: cython.longlong = time_ns()
            born = now_ns // 1_000_000
        self.born = born
        if not 0 <= message.flag <= 0xFFFF_FFFF:
            raise InvalidMessageError("message flag must fit in 32 bits")
        self.flag = message.flag
        self.index_keys = key_prefixes(message.topic, message.key) if message.key else ()
        self.queues = queues
        self.size = FIXED_SIZE + len(self.static) + slots_len + len(body)
        if self.size > max_size:
            raise MessageTooLargeError(f"message of {self.size} bytes exceeds the limit of {max_size}")


# (message, [(queue, qid, offset)], [offset per queue]): a message placed in its queues
Placed = tuple[PreparedMessage, list[tuple[str, int, int]], list[int]]


@cython.locals(p=PreparedMessage, packed=cython.ulonglong, offset=cython.ulonglong)
def place(groups: list[list[PreparedMessage]], cached: Callable[[str], int | None], resolve: Callable[[str], int],
          store_ts: int) -> tuple[list[bytes], list[Placed], dict[str, int]]:
    """Give every message of ``groups`` (in order) the next offset of each of its queues and frame
    its record: the records, each message's placement, and each queue -> its packed state after
    the group (qid, next offset). ``cached``/``resolve`` give a queue's packed state now."""
    assigned: dict[str, int] = {}
    records: list[bytes] = []
    placed: list[Placed] = []
    for prepared in groups:
        for p in prepared:
            targets = []
            offsets = []
            for name in p.queues:
                found = assigned.get(name)
                if found is None:
                    found = cached(name)
                    if found is None:
                        found = resolve(name)
                packed = found
                assigned[name] = packed + OFFSET_STEP
                offset = packed >> 32
                targets.append((name, packed & QID_MASK, offset))
                offsets.append(offset)
            records.append(assemble(p.size, p.static, p.slots, offsets, p.body, p.born, store_ts, p.flag))
            placed.append((p, targets, offsets))
    return records, placed, assigned


@cython.locals(i=cython.Py_ssize_t, p=PreparedMessage)
def put_results(groups: list[list[PreparedMessage]], positions: list[int], placed: list[Placed], id_prefix: str,
                store_ts: int) -> list[list[PutResult]]:
    """What each put of ``groups`` returns, once its records are at ``positions``."""
    out = []
    i = 0
    for prepared in groups:
        results = []
        for p in prepared:
            pos = positions[i]
            offsets = placed[i][2]
            queues = p.queues
            results.append(PutResult(id_prefix, pos, p.size, store_ts,
                                     {queues[0]: offsets[0]} if len(offsets) == 1 else dict(zip(queues, offsets))))
            i += 1
        out.append(results)
    return out


def dispatch_items(positions: list[int], placed: list[Placed], store_ts: int) -> list[tuple]:
    """The dispatcher's items (dispatcher.DispatchItem) of placed records at ``positions``."""
    return [(pos, p.size, p.tag_hash, store_ts, targets, p.index_keys)
            for pos, (p, targets, _) in zip(positions, placed)]
