"""The dispatcher (RocketMQ's ReputMessageService): commitlog records -> consume-queue entries.

Each batch of records becomes ONE RocksDB WriteBatch holding every entry, the message-key
index entries, the rows of new queues and the checkpoint (the commitlog position up to which all is indexed); only after it is written
do readers see the new offsets and does notify fire.
"""

from __future__ import annotations

from collections.abc import Callable

from .consumequeue import (
    ENTRY_KEY,
    ENTRY_PREFIX,
    ENTRY_VALUE,
    NAME_PREFIX,
    QID_MASK,
    ConsumeQueueIndex,
    head_key,
    queue_prefix,
)
from ..holds.codec import HOLD_KEY_SIZE
from .keyindex import entry as key_entry
from .notify import NotifyHub

POINT_DELETES = 256  # a dropped queue with at most this many entries has them deleted key by key

# (commitlog position, record size, tag hash, store timestamp, [(queue, qid, offset in it)],
# key-index prefixes, hold-key writes (key, value or None to delete; holds/codec.py)): a plain tuple,
# built once per message on the hot path.
DispatchItem = tuple[int, int, int, int, list[tuple[str, int, int]], tuple[bytes, ...],
                     tuple[tuple[bytes, bytes | None], ...]]


class Dispatcher:
    def __init__(self, index: ConsumeQueueIndex, notify: NotifyHub) -> None:
        self._index = index
        self._notify = notify
        # hold kind -> holds begun minus ended since open (holds/held_messages.py)
        self.hold_changes: dict[int, int] = {}
        self.hold_earliest: dict[int, int] = {}  # hold kind -> the earliest due time of holds begun since taken
        # told removed queues' names (retention/reclaim.py)
        self.on_drop: Callable[[list[str], int], None] | None = None

    def dispatch(self, items: list[DispatchItem], end_position: int, heads: dict[str, int] | None = None) -> None:
        """Index ``items`` (in commitlog order) and advance the checkpoint to ``end_position``.

        ``heads``: each queue the items go to -> pack_state(qid, its next offset after them),
        as the committer assigned them; computed here when not given (recovery)."""
        if heads is None:
            heads = {name: (offset + 1) << 32 | qid for *_, targets, _, _ in items for name, qid, offset in targets}
        batch = self._index.new_batch()
        put = batch.put
        pack_key = ENTRY_KEY.pack
        pack_value = ENTRY_VALUE.pack
        for position, size, tag, store_ts, targets, keys, holds in items:
            value = pack_value(position, size, tag, store_ts)
            for name, qid, offset in targets:
                put(pack_key(ENTRY_PREFIX, qid, offset), value)
            for prefix in keys:
                put(*key_entry(prefix, position, store_ts))
            for key, hold in holds:  # (rare: held messages and their releases)
                if hold is None:
                    batch.delete(key)
                else:
                    put(key, hold)
                if len(key) == HOLD_KEY_SIZE:  # (not its by-position twin)
                    kind = key[1]
                    self.hold_changes[kind] = self.hold_changes.get(kind, 0) + (-1 if hold is None else 1)
                    if hold is not None:
                        due = int.from_bytes(key[2:10], "big")
                        if due < self.hold_earliest.get(kind, due + 1):
                            self.hold_earliest[kind] = due
        self._index.commit(batch, end_position)
        self._index.cache.update(heads)
        self._index.trim_cache()
        if self._notify.active:
            self._notify.publish({name: packed >> 32 for name, packed in heads.items()})

    def drop(self, names: list[str], end_position: int) -> None:
        """Remove queues by name (retention/reclaim.py: their drop records end at ``end_position``): every
        entry and the head key of the queue the name means now, and its name row; in one
        WriteBatch with the checkpoint, so a crash keeps all of it or none (and re-dispatch of
        the drop records redoes it). By name, not by the qid the record also carries: a replay
        may have given the name another qid (a write refused after its queue got one)."""
        batch = self._index.new_batch()
        cache = self._index.cache
        dropped = []
        for name in names:
            packed = self._index.lookup_packed(name)
            if packed is None:
                continue
            qid, end = packed & QID_MASK, packed >> 32
            first = self._index.first_offset(qid)
            if first is None or end - first <= POINT_DELETES:
                # a light queue's few entries one by one: a range tombstone per queue would slow
                # every later read of the index (RocksDB keeps them all until compaction)
                for offset in range(end if first is None else first, end):
                    batch.delete(ENTRY_KEY.pack(ENTRY_PREFIX, qid, offset))
                batch.delete(head_key(qid))
            else:
                prefix = queue_prefix(qid)
                batch.delete_range(prefix, prefix + b"\xff" * 9)  # (past the head key)
            batch.delete(NAME_PREFIX + name.encode())
            cache.pop(name, None)
            dropped.append(name)
        self._index.commit(batch, end_position)
        if self.on_drop is not None and dropped:
            self.on_drop(dropped, end_position)
