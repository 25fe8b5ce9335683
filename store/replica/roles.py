"""A store's turn to follow or to lead its replicated group: what changes in the store itself
(writes refused or taken, meta changes journaled, a promoted follower's tail adopted). The
replication link (link.py) and whoever decides leadership (node.py) build on these two calls.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..clock import now_ms
from ..errors import NotLeaderError, StoreError
from ..holds.codec import HOLD_TOPIC
from ..log.record import encode_record
from ..log.replay import Replay, records
from ..meta.journal import MetaBatch
from .follower import FollowerLog, is_meta
from .leader import LeaderLog

if TYPE_CHECKING:
    from ..store import MessageStore

log = logging.getLogger("tidemq.store.replica")


def follow(store: MessageStore) -> FollowerLog:
    """Stop taking writes (they go to the leader) and return the log a follower writes the
    leader's bytes through; the leader's meta changes are applied as they arrive."""
    assert store.committer is not None
    store.committer.not_leader = NotLeaderError("this store follows the group's leader")
    store.meta.writes.journal = None
    return FollowerLog(store.commitlog, store.index, store.dispatcher, store.epochs, store.meta_replay)


def lead(store: MessageStore, epoch: int, token: str = "") -> LeaderLog:
    """Take writes again as the leader of ``epoch`` (no older than any this log has seen): the
    bytes written from here on are that epoch's, meta changes among them. What a follower
    received and was not told confirmed -- its unpublished tail -- is kept: its meta changes are
    applied now, its records published once confirmed in this epoch (before any new write; the
    committer places new writes after them). A record the old leader's stream cut short is
    dropped."""
    committer, commitlog, index = store.committer, store.commitlog, store.index
    assert committer is not None
    if epoch < store.epochs.current:
        raise StoreError(f"epoch {epoch} is older than this log's {store.epochs.current}")
    start = index.dispatched_position
    whole = list(records(commitlog, start, commitlog.end_position))
    end = whole[-1][0] + whole[-1][1].size if whole else start
    if end < commitlog.end_position:
        log.warning("a record cut short by the old leader's stream dropped position=%d bytes=%d", end,
                    commitlog.end_position - end)
        commitlog.truncate(end)
    if epoch > store.epochs.current:
        store.epochs.begin(epoch, commitlog.end_position)
    heads: dict[str, int] = {}
    for position, view in whole:
        if is_meta(view):
            if position >= store.meta_replay.applied:
                store.meta_replay.apply(view.body, position + view.size)
            # (replies that follow these changes wait until this epoch confirms them: meta_settling)
            store.meta_position = max(store.meta_position, position + view.size)
        for name, offset in view.queues():
            heads[name] = (offset + 1) << 32 | index.resolve(name) & 0xFFFF_FFFF
    committer.not_leader = None
    store.meta.writes.journal = lambda batch: _journal(store, batch)
    if whole:
        committer.adopt_tail(end, heads, lambda: _publish_tail(store, start, end))
    return LeaderLog(commitlog, store.epochs, token)


def _publish_tail(store: MessageStore, start: int, end: int) -> None:
    """Index a promoted follower's tail, now confirmed (its meta changes are applied)."""
    replay = Replay(store.index, store.dispatcher)
    for position, view in records(store.commitlog, start, end):
        replay.add(position, view)
    replay.flush(end)


def _journal(store: MessageStore, batch: MetaBatch) -> None:
    """A leader's meta change, into the commitlog for the followers (before it is applied
    here: the log is what every replica agrees on)."""
    now = now_ms()
    record = encode_record(topic=HOLD_TOPIC.encode(), key=b"", properties=b"", queues=[], offsets=[],
                           body=batch.encode(), born_ts=now, store_ts=now)
    store.commitlog.append([record])  # StoreWriteError: neither logged nor applied
    store.meta_position = store.meta_replay.applied = store.commitlog.end_position
    committer = store.committer
    if committer is not None:
        committer.make_durable(store.meta_position)
        if committer.on_write is not None:
            committer.on_write()
