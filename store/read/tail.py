"""Write-through to tail readers: just-committed messages handed to whoever waits at a queue's end.

A reader at the end of a queue reads every message straight back after its commit (an index
multi_get and a commitlog pread per batch). A tail reader (the queue cache) names the queues it
holds at their end in ``following``; after each commit the committer hands it the new messages
of those queues, as the ``GetResult`` a read at their first offset would return (built from
what the committer holds of each message, batching.tail_message; a release's message is read
back from its held record, by the code a read uses). Nothing here is persistent, and queues
nobody follows cost one set intersection per commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..write.batching import Placed, tail_message
from ..index.consumequeue import QID_MASK
from ..holds.codec import INDIRECT
from ..messages import GetResult, GetStatus, StoredMessage
from .reads import released, stored_message
from ..log.record import RecordView

# (commitlog position, record size, tag hash, store timestamp, [(queue, qid, offset in it)],
# key-index prefixes, hold-key writes): the dispatcher's item (dispatcher.DispatchItem).
Item = tuple[int, int, int, int, list[tuple[str, int, int]], tuple[bytes, ...], tuple]


class TailReader(Protocol):
    """A reader of queues' ends. ``following`` may change between commits, never during one."""

    following: set[str]

    def take_tail(self, queue: str, result: GetResult) -> None:
        """The messages committed to ``queue`` by one commit (FOUND, from their first offset to
        ``result.next_offset`` == the queue's end), ``min_offset`` as a read now would say.
        Called on the event loop's thread, right after the commit; must not raise."""


class TailHandoff:
    """The committer's side: which readers follow which queues, and the hand-off itself."""

    __slots__ = ("_id_prefix", "_min_offset", "_read", "readers")

    def __init__(self, id_prefix: str, min_offset: Callable[[int, int], int], read: Callable[[int, int], bytes]) -> None:
        self._id_prefix = id_prefix
        self._min_offset = min_offset  # (qid, next offset) -> the queue's first readable offset
        self._read = read  # the commitlog's (a release's held message was written before)
        self.readers: list[TailReader] = []

    def hand(self, items: list[Item], records: list[bytes], placed: list[Placed], store_ts: int,
             heads: dict[str, int]) -> None:
        """Hand the readers the messages of ``items`` (their ``records`` and placements, in
        order) for the queues they follow; ``heads``: queue -> pack_state(qid, its next offset
        after them)."""
        wanted: set[str] = set()
        for reader in self.readers:
            if reader.following:
                wanted |= heads.keys() & reader.following  # (iterates the smaller of the two)
        if not wanted:
            return
        built: dict[str, list[StoredMessage]] = {name: [] for name in wanted}
        id_prefix = self._id_prefix
        for record, (position, size, tag, _, targets, _, _), (prepared, _, _) in zip(records, items, placed):
            view = None
            for name, _, offset in targets:
                messages = built.get(name)
                if messages is None:
                    continue
                if not size & INDIRECT:
                    messages.append(tail_message(prepared, record, position, store_ts, name, offset, tag, id_prefix))
                    continue
                if view is None:  # a release: its message is the held record (no CRC check: read back just now)
                    position, view = released(self._read, RecordView(record, 0, verify=False))
                messages.append(stored_message(view, id_prefix, position, name, offset, tag))
        for name, messages in built.items():
            packed = heads[name]
            end = packed >> 32
            result = GetResult(GetStatus.FOUND, messages, end, self._min_offset(packed & QID_MASK, end), end)
            for reader in self.readers:
                if name in reader.following:
                    reader.take_tail(name, result)
