"""A follower's side of replication, without I/O of its own: the leader's bytes written where
the leader holds them and indexed as recovery indexes (``Replay``), the log cut back where it
stopped agreeing with the leader's, and the fencing of older epochs.

``FollowerLog`` works on the store's own commitlog, index and dispatcher: a promoted follower
is a store that has been indexing all along, with nothing to rebuild.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from ..errors import RecordCorruptError, StoreError
from ..index.consumequeue import ConsumeQueueIndex
from ..index.dispatcher import Dispatcher
from ..log.commitlog import CommitLog
from ..log.record import HEADER_SIZE, RecordView
from ..holds.codec import HOLD_TOPIC
from ..log.recovery import META_OP, Replay
from .epochs import EpochHistory
from .wire import Ack, Data, Hello, Welcome

log = logging.getLogger("tidemq.store.replica")


class StaleEpochError(StoreError):
    """Bytes from a leader whose epoch is older than one this replica has seen."""


class FollowerLog:
    def __init__(self, commitlog: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher,
                 epochs: EpochHistory, on_meta: Callable[[bytes], None] | None = None,
                 undo_meta: Callable[[bytes], None] | None = None) -> None:
        self._log = commitlog
        self._index = index
        self._replay = Replay(index, dispatcher, on_meta)
        self._undo_meta = undo_meta  # undoes one meta change record (a tail being cut)
        self.epochs = epochs
        self.leader_epoch = 0  # the epoch of the leader this log follows now
        self.confirmed = 0  # the leader's confirmed position, as last heard
        self._parsed = index.dispatched_position  # the next record to index starts here

    def hello(self, node: str, token: str) -> Hello:
        return Hello(node, token, self._log.segment_size, self._log.end_position, self._log.min_position,
                     list(self.epochs.entries))

    def welcome(self, frame: Welcome) -> int:
        """Take the leader's answer: cut the log back to where it agrees with the leader's (log
        first, then the index, then the epoch file: a crash between them leaves the index ahead
        of the log, which recovery cuts back, and epochs that hold nothing); return the position
        the leader streams from. Bytes cut are bytes no in-sync set ever confirmed."""
        if frame.epoch < self.epochs.current:
            raise StaleEpochError(f"leader epoch {frame.epoch} is older than this replica's {self.epochs.current}")
        end = self._log.end_position
        if frame.agreed_end < end:
            if self._undo_meta is not None:  # (before the log: a crash redoes them at recovery, then undoes again)
                changes = [view.body for _, view in self._records(frame.agreed_end, end)
                           if view.topic == HOLD_TOPIC and view.body[:1] == META_OP and not view.queue_count]
                for body in reversed(changes):
                    self._undo_meta(body)
            dropped = self._log.truncate(frame.agreed_end)
            removed = self._index.truncate_beyond(frame.agreed_end)
            log.warning("replica log cut back to the leader's position=%d bytes_dropped=%d index_entries_removed=%d",
                        frame.agreed_end, dropped, removed)
        self.epochs.cut(self._log.end_position, frame.epochs)
        self.leader_epoch = frame.epoch
        self._parsed = min(self._parsed, self._log.end_position, self._index.dispatched_position)
        return self._log.end_position

    def apply(self, frame: Data) -> Ack:
        """Write and index one DATA frame's bytes; what to acknowledge (durability is the
        caller's: ``Ack.durable`` says what the commitlog's last flush covers)."""
        if frame.epoch != self.leader_epoch:
            raise StaleEpochError(f"bytes of epoch {frame.epoch} while following epoch {self.leader_epoch}")
        self.confirmed = max(self.confirmed, frame.confirmed)
        if frame.payload:
            self._log.append_at(frame.position, frame.payload)
            self._index_new_records()
        return Ack(self._log.end_position, self._log.flushed_position)

    def _index_new_records(self) -> None:
        at = self._parsed
        for position, view in self._records(at, self._log.end_position):
            self._replay.add(position, view)
            at = position + view.size
        if at == self._parsed:
            return
        self._replay.flush(at)
        self._parsed = at

    def _records(self, start: int, end: int) -> Iterator[tuple[int, RecordView]]:
        """The whole records from ``start`` (a record's start) up to ``end``, across segment rolls."""
        log_ = self._log
        size = log_.segment_size
        at = start
        while at < end:
            seg = log_.segment_of(at)
            seg_end = min(seg.start + seg.length, end) if seg is not None else at
            if at >= seg_end:  # the rest of this segment is unused: the leader rolled
                at = at - at % size + size
                continue
            buf = log_.read(at, seg_end - at)
            off = 0
            while len(buf) - off >= HEADER_SIZE:
                total = int.from_bytes(buf[off:off + 4], "big")
                if len(buf) - off < total:
                    break
                try:
                    view = RecordView(buf, off)
                except RecordCorruptError as exc:
                    raise StoreError(f"replicated record at {at + off} is damaged: {exc}") from None
                yield at + off, view
                off += total
            at += off
            if at < seg_end:  # a record the next frame completes
                return
