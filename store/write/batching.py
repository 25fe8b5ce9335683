"""The committer's per-message bookkeeping, compiled (sans-IO: no asyncio, no files): a message
encoded as far as it can be before it has queue offsets (``PreparedMessage``), a group's
offsets assigned and records framed (``place``), and what each put returns (``put_results``).

The committer (write/committer.py) runs these between its awaits; the dispatcher indexes what
``place`` returns once the records are in the commitlog.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from time import time_ns

import cython

from ..errors import InvalidMessageError, MessageTooLargeError
from ..holds.codec import HELD, HOLD_TOPIC, INDIRECT, KINDS, hold_body, hold_key, hold_value, hold_writes, nested_offset
from ..index.keyindex import key_prefixes
from ..messages import TAGS_PROPERTY, Message, PutResult, StoredMessage, tag_hash
from ..log.record import (FIXED_SIZE, STATIC_HEAD, assemble, encode_properties, encode_queues, encode_record, encode_static,
                          queue_slots_of)

QID_MASK = 0xFFFF_FFFF  # (the low half of a queue's packed state: consumequeue.pack_state)
OFFSET_STEP = 1 << 32  # one more offset in a packed state
NESTED = nested_offset()  # a hold record's position -> its nested record's
MAX_DUE = 1 << 63


@cython.no_gc  # not tracked by the cyclic GC, one per message (bytes, ints, a tuple and lists of bytes, the caller's queue names: it can be in no cycle)
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
    # what a read of the record returns as these fields, kept for the tail readers (tail_message)
    topic = cython.declare(str, visibility="readonly")
    key = cython.declare(str, visibility="readonly")
    raw_properties = cython.declare(bytes, visibility="readonly")
    tag_hash = cython.declare(cython.longlong, visibility="readonly")
    # a held message (holds/codec.py): its kind (0: none) and due time; a release or discard: the
    # hold key its dispatch deletes
    hold_kind = cython.declare(cython.int, visibility="readonly")
    hold_due = cython.declare(cython.longlong, visibility="readonly")
    settles = cython.declare(object, visibility="readonly")  # bytes | None

    def __init__(self, message: Message, queues: Sequence[str], max_size: int, hold_kind: int = 0,
                 hold_due: int = 0, settles: bytes | None = None, tag: int | None = None) -> None:
        if not queues and settles is None:
            raise InvalidMessageError("a message needs at least one target queue")
        if settles is None and message.topic == HOLD_TOPIC:  # (releases and discards are the store's own)
            raise InvalidMessageError(f"the topic {HOLD_TOPIC} is reserved for the store's control records")
        if not hold_kind and message.hold_kind:
            hold_kind, hold_due = message.hold_kind, message.hold_due_ms
        if hold_kind and (hold_kind not in KINDS or not 0 <= hold_due < MAX_DUE):
            raise InvalidMessageError(f"bad hold: kind {hold_kind}, due time {hold_due}")
        self.hold_kind = hold_kind
        self.hold_due = hold_due
        self.settles = settles
        body = message.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise InvalidMessageError("message body must be bytes")
            body = bytes(body)
        # (a release: its entries carry the held message's tag hash)
        self.tag_hash = tag if tag is not None else tag_hash(message.tags) if message.tags else 0
        slots, slots_len = queue_slots_of(queues)
        self.slots = slots
        raw_properties = record_properties(message)
        self.static = encode_static(
            message.topic.encode(), message.key.encode() if message.key else b"", raw_properties, len(queues),
            len(body),
        )
        # (as a read returns them: a str, not a subclass of it)
        topic, key = message.topic, message.key or ""
        self.topic = topic if type(topic) is str else str(topic)
        self.key = key if type(key) is str else str(key)
        self.raw_properties = raw_properties
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


def record_properties(message: Message) -> bytes:
    """The properties block of ``message``'s record: its properties (encoded already, or encoded
    here) with its tags as the TAGS property."""
    tags = message.tags
    encoded = message.encoded_properties
    if encoded is not None:
        if type(encoded) is not bytes:  # (a bytearray is the caller's: never extended in place)
            encoded = bytes(encoded)
        # an encoding is a run of pairs: the tags pair can follow
        return encoded + encode_properties({TAGS_PROPERTY: tags}) if tags else encoded
    props = message.properties
    if tags:
        props = {**(props or {}), TAGS_PROPERTY: tags}
    return encode_properties(props) if props else b""


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
            if p.hold_kind:  # indexed later (holds/codec.py): no offsets now
                records.append(_hold_record(p, store_ts))
                placed.append((p, [], []))
                continue
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


@cython.cfunc
def _hold_record(p: PreparedMessage, store_ts: cython.longlong) -> bytes:
    """A held message's control record: the hold header and the message's record inside."""
    nested = assemble(p.size, p.static, p.slots, [HELD] * len(p.slots), p.body, p.born, store_ts, p.flag)
    return encode_record(topic=HOLD_TOPIC.encode(), key=b"", properties=b"", queues=[], offsets=[],
                         body=hold_body(p.hold_kind, p.hold_due, nested), born_ts=p.born, store_ts=store_ts)


@cython.locals(start=cython.Py_ssize_t)
def put_results(groups: list[list[PreparedMessage]], positions: list[int], placed: list[Placed], id_prefix: str,
                store_ts: int) -> list[PutResults]:
    """What each put of ``groups`` returns, once its records are at ``positions``."""
    out = []
    start = 0
    for prepared in groups:
        out.append(PutResults(prepared, positions, placed, start, id_prefix, store_ts))
        start += len(prepared)
    return out


@cython.cclass
class PutResults:
    """What one put returns: a sequence of ``PutResult`` (``collections.abc.Sequence``, not a
    list: read, index, slice, iterate, compare), one per message in put order, each built when
    it is read (the queue lists the put named are read then: the callers' own, never changed).
    Most puts' results are never read (the MQTT and AMQP gateways acknowledge a publish by its
    packet or delivery tag): built up front, a PutResult and its offsets dict cost the MQTT
    fan-in ~0.3 us a message (py-spy, 3.7 % of its samples)."""

    _prepared = cython.declare(list)  # the put's PreparedMessages
    _positions = cython.declare(list)  # their records' positions
    _offsets = cython.declare(list)  # their offsets in their queues
    _id_prefix = cython.declare(str)
    _store_ts = cython.declare(object)

    @cython.locals(start=cython.Py_ssize_t, end=cython.Py_ssize_t)
    def __init__(self, prepared: list[PreparedMessage], positions: list[int], placed: list[Placed], start: int,
                 id_prefix: str, store_ts: int) -> None:
        # this put's share of the commit only: the results must not keep other puts' messages
        end = start + len(prepared)
        self._prepared = prepared
        self._positions = positions[start:end]
        self._offsets = [entry[2] for entry in placed[start:end]]
        self._id_prefix = id_prefix
        self._store_ts = store_ts

    def __len__(self) -> int:
        return len(self._prepared)

    @cython.locals(i=cython.Py_ssize_t, n=cython.Py_ssize_t, p=PreparedMessage)
    def _result(self, i: int) -> PutResult:
        n = len(self._prepared)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("put result index out of range")
        p = self._prepared[i]
        pos = self._positions[i]
        if p.hold_kind:  # the held message is the nested record; no offsets yet
            return PutResult(self._id_prefix, pos + NESTED, p.size, self._store_ts, {})
        queues = p.queues
        offsets = self._offsets[i]
        return PutResult(self._id_prefix, pos, p.size, self._store_ts,
                         {queues[0]: offsets[0]} if len(offsets) == 1 else dict(zip(queues, offsets)))

    @cython.locals(i=cython.Py_ssize_t, p=PreparedMessage)
    def places(self) -> list[tuple[int, int, int, list[str], list[int]]]:
        """Each result's (position, size, store time, queue names, offsets in them), in put
        order, without making the results (a store node's answer to a gateway node's put is
        made of these)."""
        out: list[tuple[int, int, int, list[str], list[int]]] = []
        store_ts = self._store_ts
        for i in range(len(self._prepared)):
            p = self._prepared[i]
            if p.hold_kind:  # (as ``_result``: the nested record, no offsets yet)
                out.append((self._positions[i] + NESTED, p.size, store_ts, [], []))
            else:
                out.append((self._positions[i], p.size, store_ts, p.queues, self._offsets[i]))
        return out

    def __getitem__(self, index: int | slice) -> PutResult | list[PutResult]:
        if isinstance(index, slice):
            return [self._result(i) for i in range(*index.indices(len(self._prepared)))]
        try:
            return self._result(index)
        except OverflowError:  # (an index past any C size: as out of range as the list's)
            raise IndexError("put result index out of range") from None

    def index(self, value: object) -> int:
        return list(self).index(value)

    def count(self, value: object) -> int:
        return list(self).count(value)

    def __iter__(self):  # noqa: ANN204
        return iter([self._result(i) for i in range(len(self._prepared))])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):  # (either build's PutResults too)
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


@cython.locals(p=PreparedMessage, start=cython.Py_ssize_t, end=cython.Py_ssize_t)
def tail_message(p: PreparedMessage, record: bytes, position: int, store_ts: int, queue: str, offset: int, tag: int,
                 id_prefix: str) -> StoredMessage:
    """What a read of ``queue`` at ``offset`` returns for ``p``, an indexed message just framed
    in ``record`` at ``position`` (not a release: its message is another record), built for the
    tail readers (read/tail.py) from the fields ``p`` holds, only its queue list sliced from the
    record: decoding the record again cost them 0.46 us a message, this 0.1 (a differential test,
    tests/test_store_tail_messages.py, holds it to what a read returns)."""
    start = FIXED_SIZE + len(p.static)
    end = p.size - len(p.body)
    return StoredMessage(None, position, p.size, p.topic, p.key, p.body, int(p.born), store_ts, p.raw_properties,
                         record[start:end], len(p.queues), queue, offset, tag, int(p.flag), None, id_prefix)


def receipt_messages(message: Message, receipt: PutResult, queues: Sequence[str]) -> list[StoredMessage] | None:
    """What reads of ``queues`` (some of the receipt's) return for ``message``, which a put
    stored as ``receipt`` says: built by the writer from what it sent (a gateway node's own
    publishes, for its queue cache), not read back. None when they cannot be: its born time
    left to the store's clock, a held message, or fields that do not make the receipt's size."""
    return _receipt_messages(message, receipt, queues, {})


@cython.locals(size=cython.Py_ssize_t)
def _receipt_messages(message: Message, receipt: PutResult, queues: Sequence[str],
                      sizes: dict[str, int]) -> list[StoredMessage] | None:
    """``sizes``: a topic's UTF-8 length, as far as known (a put's messages share a few)."""
    born = message.born_timestamp
    if born is None or message.hold_kind:
        return None
    topic, key, body = message.topic, message.key or "", message.body
    if type(topic) is not str or type(key) is not str or type(body) is not bytes:
        return None  # (as a read returns them: built by PreparedMessage's rules only for the plain types)
    offsets = receipt.queue_offsets
    raw_properties = record_properties(message)
    raw_queues = encode_queues(list(offsets.items()))
    topic_size = sizes.get(topic)
    if topic_size is None:
        topic_size = sizes[topic] = len(topic.encode())
    size = (FIXED_SIZE + STATIC_HEAD + topic_size + (len(key.encode()) if key else 0) + len(raw_properties)
            + len(raw_queues) + len(body))
    if size != receipt.size:
        return None
    tag = tag_hash(message.tags) if message.tags else 0
    position, store_ts, id_prefix, count, flag = (receipt.position, receipt.store_timestamp, receipt.id_prefix,
                                                  len(offsets), message.flag)
    return [StoredMessage(None, position, size, topic, key, body, born, store_ts, raw_properties, raw_queues, count,
                          queue, offsets[queue], tag, flag, None, id_prefix) for queue in queues]


def receipt_tails(items: Sequence[tuple[Message, Sequence[str]]], receipts: Sequence[PutResult],
                  following: Container[str]) -> dict[str, list[StoredMessage]]:
    """For each queue of ``following`` a put's messages went to: what reads of it return for
    them, in put order (``receipt_messages``). A message that cannot be built is left out: the
    caller sees the gap in its queues' offsets."""
    out: dict[str, list[StoredMessage]] = {}
    sizes: dict[str, int] = {}
    for (message, _), receipt in zip(items, receipts):
        wanted = [queue for queue in receipt.queue_offsets if queue in following]
        if wanted:
            built = _receipt_messages(message, receipt, wanted, sizes)
            if built is not None:
                for queue, stored in zip(wanted, built):
                    tail = out.get(queue)
                    if tail is None:
                        out[queue] = [stored]
                    else:
                        tail.append(stored)
    return out


Sequence.register(PutResults)


@cython.locals(p=PreparedMessage)
def dispatch_items(positions: list[int], placed: list[Placed], store_ts: int) -> list[tuple]:
    """The dispatcher's items (dispatcher.DispatchItem) of placed records at ``positions``."""
    items = []
    for pos, (p, targets, _) in zip(positions, placed):
        if p.hold_kind:
            key = hold_key(p.hold_kind, p.hold_due, pos + NESTED)
            items.append((pos, p.size, p.tag_hash, store_ts, targets, (),
                          hold_writes(key, hold_value(p.size, p.tag_hash, store_ts, p.queues))))
        elif p.settles is not None:  # a release (entries read through it) or a discard
            items.append((pos, p.size | INDIRECT if targets else p.size, p.tag_hash, store_ts, targets, (),
                          hold_writes(p.settles, None)))
        else:
            items.append((pos, p.size, p.tag_hash, store_ts, targets, p.index_keys, ()))
    return items

