"""The dispatcher (RocketMQ's ReputMessageService): commitlog records -> consume-queue entries.

Each batch of records becomes ONE RocksDB WriteBatch holding every entry, the updated
queue rows and the checkpoint (the commitlog position up to which all is indexed);
only after it is written do readers see the new offsets and does notify fire.
"""

from __future__ import annotations

from .consumequeue import ENTRY_KEY, ENTRY_PREFIX, ENTRY_VALUE, QUEUE_ROW, ConsumeQueueIndex, QueueState
from .notify import NotifyHub


# (commitlog position, record size, tag hash, store timestamp, [(queue, offset in it)]):
# a plain tuple, built once per message on the hot path.
DispatchItem = tuple[int, int, int, int, list[tuple[QueueState, int]]]


class Dispatcher:
    def __init__(self, index: ConsumeQueueIndex, notify: NotifyHub) -> None:
        self._index = index
        self._notify = notify

    def dispatch(self, items: list[DispatchItem], end_position: int) -> None:
        """Index ``items`` (in commitlog order) and advance the checkpoint to ``end_position``."""
        batch = self._index.new_batch()
        put = batch.put
        pack_key = ENTRY_KEY.pack
        pack_value = ENTRY_VALUE.pack
        newest: dict[QueueState, tuple[int, int]] = {}
        for position, size, tag, store_ts, targets in items:
            value = pack_value(position, size, tag, store_ts)
            for state, offset in targets:
                put(pack_key(ENTRY_PREFIX, state.qid, offset), value)
                newest[state] = (offset, position)
        for state, (offset, position) in newest.items():
            next_offset = max(state.next_offset, offset + 1)
            put(state.row_key(), QUEUE_ROW.pack(state.qid, next_offset, position))
            newest[state] = (next_offset, position)
        self._index.commit(batch, end_position)
        for state, (next_offset, position) in newest.items():
            state.next_offset = next_offset
            state.last_position = position
        self._index.trim_cache()
        if self._notify.active:
            self._notify.publish({state.name: next_offset for state, (next_offset, _) in newest.items()})
