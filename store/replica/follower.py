"""A follower's side of replication, without I/O of its own: the leader's bytes written where
the leader holds them and, once confirmed, indexed as recovery indexes (``Replay``); the log cut
back where it stopped agreeing with the leader's; the fencing of older epochs.

``FollowerLog`` works on the store's own commitlog, index and dispatcher: a promoted follower
is a store that has been indexing all along; only its unconfirmed tail is left to publish
(``MessageStore.lead``).
"""

from __future__ import annotations

import logging

from ..errors import StoreError
from ..holds.codec import HOLD_TOPIC
from ..index.consumequeue import ConsumeQueueIndex
from ..index.dispatcher import Dispatcher
from ..log.commitlog import CommitLog
from ..log.record import RecordView
from ..log.replay import META_OP, Replay, records
from ..meta.journal import MetaReplay
from .epochs import EpochHistory
from .wire import Ack, Data, Hello, Welcome

log = logging.getLogger("tidemq.store.replica")


class StaleEpochError(StoreError):
    """Bytes from a leader whose epoch is older than one this replica has seen."""


class FollowerLog:
    """A follower indexes (and applies the meta changes of) only what the leader has said is
    confirmed: a reader of a promoted follower never sees a record the group could still lose."""

    def __init__(self, commitlog: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher,
                 epochs: EpochHistory, meta: MetaReplay | None = None) -> None:
        self._log = commitlog
        self._index = index
        self._meta = meta
        self._replay = Replay(index, dispatcher, meta.apply_records if meta is not None else None)
        self.epochs = epochs
        self.leader_epoch = 0  # the epoch of the leader this log follows now
        self.confirmed = 0  # the leader's confirmed position, as last heard
        self._parsed = index.dispatched_position  # the next record to index starts here

    @property
    def indexed(self) -> int:
        """Where the next record to index starts (what is before it is indexed)."""
        return self._parsed

    def hello(self, node: str, token: str) -> Hello:
        return Hello(node, token, self._log.segment_size, self._log.end_position, self._log.min_position,
                     list(self.epochs.entries))

    def welcome(self, frame: Welcome) -> int:
        """Take the leader's answer: cut the log back to where it agrees with the leader's, and
        return the position the leader streams from. In this order: the meta changes of the cut
        records that were applied are undone, newest first; then the log is cut, then the index,
        then the epoch file. A crash between them leaves what recovery repairs: changes applied
        again from the log (and undone at the next cut), an index ahead of the log (cut back),
        epochs that hold nothing. Bytes cut are bytes no in-sync set ever confirmed."""
        if frame.epoch < self.epochs.current:
            raise StaleEpochError(f"leader epoch {frame.epoch} is older than this replica's {self.epochs.current}")
        end = self._log.end_position
        if frame.agreed_end < end:
            if self._meta is not None and self._meta.applied > frame.agreed_end:
                changes = [view.body for _, view in records(self._log, frame.agreed_end, min(end, self._meta.applied))
                           if is_meta(view)]
                for body in reversed(changes):
                    self._meta.undo(body)
                self._meta.applied = frame.agreed_end
            dropped = self._log.truncate(frame.agreed_end)
            removed = self._index.truncate_beyond(frame.agreed_end)
            log.warning("replica log cut back to the leader's position=%d bytes_dropped=%d index_entries_removed=%d",
                        frame.agreed_end, dropped, removed)
        self.epochs.cut(self._log.end_position, frame.epochs)
        self.leader_epoch = frame.epoch
        self._parsed = min(self._parsed, self._log.end_position, self._index.dispatched_position)
        return self._log.end_position

    def apply(self, frame: Data) -> Ack:
        """Write one DATA frame's bytes and take its confirmed position; what to acknowledge
        (durability is the caller's: ``Ack.durable`` says what the commitlog's last flush covers).
        ``index_confirmed`` indexes, once for the frames read together."""
        if frame.epoch != self.leader_epoch:
            raise StaleEpochError(f"bytes of epoch {frame.epoch} while following epoch {self.leader_epoch}")
        if frame.payload:
            self._log.append_at(frame.position, frame.payload)
        if frame.confirmed > self.confirmed:
            self.confirmed = frame.confirmed
        return Ack(self._log.end_position, self._log.flushed_position)

    def index_confirmed(self) -> None:
        """Index (and apply the meta changes of) the whole records up to the confirmed position."""
        try:
            at = self._replay.add_records(self._log, self._parsed, min(self.confirmed, self._log.end_position))
            if at != self._parsed:
                self._replay.flush(at)
                self._parsed = at
        except BaseException:
            self._replay.discard()  # (the next call adds them again, from ``_parsed``)
            raise


def is_meta(view: RecordView) -> bool:
    """A meta change record (meta/journal.py)."""
    return view.topic == HOLD_TOPIC and view.body[:1] == META_OP and not view.queue_count
