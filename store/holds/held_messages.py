"""The store's held messages (holds/codec.py has the records and keys): put one held, find those due,
release them into their queues, or discard them. ``MessageStore.held`` is this component.

One writer for every kind: timer messages (released at their due time by the gateway's timer
service) and transactional half messages (released or discarded when the transaction ends).
A release or discard is a small control record written through the group committer like any
put, so it is durable, ordered and acknowledged the same way, and a restart re-dispatches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rocksdict import ReadOptions, WriteBatch

from ..rocks import raw_items, raw_keys
from ..write.batching import PreparedMessage
from ..index.consumequeue import ConsumeQueueIndex
from .codec import (
    HOLD_PREFIX,
    HOLD_TOPIC,
    KINDS,
    POSITION_PREFIX,
    discard_body,
    hold_key,
    hold_value,
    kind_prefix,
    parse_hold_key,
    parse_hold_value,
    position_key,
    release_body,
)
from ..messages import Message, PutResult, StoredMessage


@dataclass(slots=True, frozen=True)
class Hold:
    """A held message as its hold key says: what a release needs."""

    key: bytes
    kind: int
    due_ms: int
    target: int  # commitlog position of the held message's record (its message id's)
    size: int
    tag_hash: int
    hold_ts: int  # store time of the hold
    queues: tuple[str, ...]
    checks: int = 0  # a half message: how often its producer was asked (transactions)


class HeldMessages:
    def __init__(self, index: ConsumeQueueIndex, submit: Callable[[list[PreparedMessage]], asyncio.Future[Sequence[PutResult]]],
                 max_message_size: int, changes: dict[int, int], earliest: dict[int, int]) -> None:
        self._index = index
        self._changes = changes  # the dispatcher's: holds begun minus ended, per kind, since open
        self._earliest = earliest  # the dispatcher's: earliest due time of holds begun, per kind, since taken
        self._counted: dict[int, tuple[int, int]] = {}  # kind -> (keys counted once, changes then)
        self._submit = submit
        self._limit = max_message_size
        # hold keys whose release, discard or roll is submitted and not yet committed: each hold
        # ends once, whoever asks (the timer service, a transaction's end, retention's roll)
        self._settling: set[bytes] = set()

    async def put(self, message: Message, queues: Sequence[str], kind: int, due_ms: int) -> PutResult:
        """(Or any put of a message whose ``hold_kind`` is set.) Store ``message`` held (``kind``: holds.TIMER or HALF) for ``queues``: in no queue until
        it is released. Durable when it returns; the result's position and message id are
        those the message keeps once released (its queue offsets come with the release)."""
        return (await self.put_batch([(message, queues)], kind, due_ms))[0]

    def put_batch(self, items: Iterable[tuple[Message, Sequence[str]]], kind: int, due_ms: int | Sequence[int]
                  ) -> asyncio.Future[Sequence[PutResult]]:
        """Several held messages in one group commit; ``due_ms`` one for all or one each."""
        if kind not in KINDS:
            raise ValueError(f"unknown hold kind {kind!r}")
        items = list(items)
        dues = [due_ms] * len(items) if isinstance(due_ms, int) else list(due_ms)
        if len(dues) != len(items):
            raise ValueError("one due time per message")
        return self._submit([PreparedMessage(message, queues, self._limit, kind, due)
                             for (message, queues), due in zip(items, dues)])

    def due(self, kind: int, now_ms: int, limit: int, from_ms: int = 0) -> list[Hold]:
        """Held messages of ``kind`` due at or before ``now_ms``, oldest due first (at most
        ``limit``; those due from ``from_ms`` on: see ``take_earliest``); those being settled
        are left out."""
        start = kind_prefix(kind)
        opts = ReadOptions()
        opts.set_iterate_upper_bound(start + (now_ms + 1).to_bytes(8, "big"))
        out: list[Hold] = []
        for key, value in raw_items(self._index.db, start + from_ms.to_bytes(8, "big"), opts):
            if len(out) >= limit:
                break
            if key not in self._settling:
                out.append(_hold(key, value))
        return out

    def next_due_ms(self, kind: int, from_ms: int = 0) -> int | None:
        """The earliest due time of ``kind``'s held messages (from ``from_ms`` on), or None."""
        opts = ReadOptions()
        opts.set_iterate_upper_bound(bytes((HOLD_PREFIX[0], kind + 1)))
        for key in raw_keys(self._index.db, kind_prefix(kind) + from_ms.to_bytes(8, "big"), opts):
            return parse_hold_key(key)[1]
        return None

    def take_earliest(self, kind: int) -> int | None:
        """The earliest due time of ``kind``'s holds begun since the last call (None: none begun).
        A reader that released every hold due before some time T seeks from min(T, this) on:
        the keys it released before T are deleted, and RocksDB would walk their tombstones."""
        return self._earliest.pop(kind, None)

    def count(self, kind: int) -> int:
        """Held messages of ``kind``: the keys walked once, then kept up by the dispatcher's count."""
        counted = self._counted.get(kind)
        if counted is None:
            opts = ReadOptions()
            opts.set_iterate_upper_bound(bytes((HOLD_PREFIX[0], kind + 1)))
            counted = self._counted[kind] = (sum(1 for _ in raw_keys(self._index.db, kind_prefix(kind), opts)),
                                             self._changes.get(kind, 0))
        return counted[0] + self._changes.get(kind, 0) - counted[1]

    def due_within(self, kind: int, now_ms: int, bounds_s: Sequence[float], limit: int) -> list[int]:
        """How many held messages of ``kind`` are due within each of ``bounds_s`` (ascending
        seconds from ``now_ms``), from a walk of at most ``limit`` keys (beyond it: not counted)."""
        counts = [0] * len(bounds_s)
        opts = ReadOptions()
        opts.set_iterate_upper_bound(kind_prefix(kind) + (now_ms + int(bounds_s[-1] * 1000) + 1).to_bytes(8, "big"))
        for n, key in enumerate(raw_keys(self._index.db, kind_prefix(kind), opts)):
            if n >= limit:
                break
            due_in = (parse_hold_key(key)[1] - now_ms) / 1000
            for i, bound in enumerate(bounds_s):
                if due_in <= bound:
                    counts[i] += 1
        return counts

    def below(self, position: int, limit: int) -> list[Hold]:
        """Held messages whose record lies below ``position``, lowest first (at most ``limit``)."""
        opts = ReadOptions()
        opts.set_iterate_upper_bound(position_key(position))
        out = []
        for key in self._index.db.values(from_key=POSITION_PREFIX, read_opt=opts):
            hold = self.get(key)
            if hold is not None:
                out.append(hold)
            if len(out) >= limit:
                break
        return out

    async def roll(self, holds: Sequence[Hold], read_at: Callable[[int], StoredMessage | None]) -> int:
        """Copy held messages forward (retention is about to delete their records): each is held
        again, same kind and due time, and its old hold ends in the same group commit. Returns
        how many were rolled (one whose record is already gone cannot be, and is dropped)."""
        holds = self._claim(holds)
        prepared = []
        for hold in holds:
            message = read_at(hold.target)
            if message is not None:
                copy = Message(message.topic, message.body, key=message.key or None, born_timestamp=message.born_timestamp,
                               encoded_properties=message.raw_properties, flag=message.flag)
                prepared.append(PreparedMessage(copy, hold.queues, self._limit, hold.kind, hold.due_ms, tag=hold.tag_hash))
            prepared.append(_discard(hold, self._limit))
        await self._settle(holds, prepared)
        return sum(1 for p in prepared if p.hold_kind)

    def at(self, target: int) -> Hold | None:
        """The held message whose record is at ``target`` (its message id's position), or None."""
        key = self._index.db.get(position_key(target))
        return None if key is None else self.get(key)

    def reschedule(self, hold: Hold, due_ms: int) -> Hold | None:
        """Move a hold to ``due_ms``, one check more (a half message asked about): an index
        write, not logged (after a crash the hold may be due at its former time again). None
        when the hold is ending (being settled) or gone."""
        if hold.key in self._settling or self._index.db.get(hold.key) is None:
            return None
        key = hold_key(hold.kind, due_ms, hold.target)
        batch = WriteBatch(raw_mode=True)
        batch.delete(hold.key)
        batch.put(key, hold_value(hold.size, hold.tag_hash, hold.hold_ts, hold.queues, hold.checks + 1))
        batch.put(position_key(hold.target), key)
        self._index.db.write(batch)
        return Hold(key, hold.kind, due_ms, hold.target, hold.size, hold.tag_hash, hold.hold_ts, hold.queues,
                    hold.checks + 1)

    def get(self, key: bytes) -> Hold | None:
        value = self._index.db.get(key)
        return None if value is None else _hold(key, value)

    def release(self, holds: Sequence[Hold]) -> asyncio.Future[Sequence[PutResult]]:
        """Index held messages into their queues now (one release record each, one group
        commit); the results give the offsets they got, one per hold not already being settled
        (a hold ends once: a second release would index the message twice)."""
        holds = self._claim(holds)
        prepared = [PreparedMessage(Message(HOLD_TOPIC, release_body(h.target, h.size, h.tag_hash, h.key)), h.queues,
                                    self._limit, settles=h.key, tag=h.tag_hash) for h in holds]
        return self._settle(holds, prepared)

    def discard(self, holds: Sequence[Hold]) -> asyncio.Future[Sequence[PutResult]]:
        """Drop held messages for good (a rolled-back transaction): never indexed."""
        holds = self._claim(holds)
        return self._settle(holds, [_discard(h, self._limit) for h in holds])

    def _claim(self, holds: Sequence[Hold]) -> list[Hold]:
        claimed = [h for h in holds if h.key not in self._settling]
        self._settling.update(h.key for h in claimed)
        return claimed

    def _settle(self, holds: list[Hold], prepared: list[PreparedMessage]) -> asyncio.Future[Sequence[PutResult]]:
        if not prepared:
            done: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        try:
            fut = self._submit(prepared)
        except BaseException:
            self._settling.difference_update(h.key for h in holds)
            raise
        fut.add_done_callback(lambda _: self._settling.difference_update(h.key for h in holds))
        return fut


def _discard(hold: Hold, limit: int) -> PreparedMessage:
    return PreparedMessage(Message(HOLD_TOPIC, discard_body(hold.key)), (), limit, settles=hold.key)


def _hold(key: bytes, value: bytes) -> Hold:
    kind, due, target = parse_hold_key(key)
    size, tag, hold_ts, checks, queues = parse_hold_value(value)
    return Hold(key, kind, due, target, size, tag, hold_ts, tuple(queues), checks)
