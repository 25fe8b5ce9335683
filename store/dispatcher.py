"""The dispatcher (RocketMQ's ReputMessageService): commitlog records -> consume-queue entries.

Each batch of records becomes ONE RocksDB WriteBatch holding every entry, the message-key
index entries, the rows of new queues and the checkpoint (the commitlog position up to which all is indexed); only after it is written
do readers see the new offsets and does notify fire.
"""

from __future__ import annotations

from .consumequeue import ENTRY_KEY, ENTRY_PREFIX, ENTRY_VALUE, ConsumeQueueIndex
from .keyindex import entry as key_entry
from .notify import NotifyHub

# (commitlog position, record size, tag hash, store timestamp, [(queue, qid, offset in it)],
# key-index prefixes): a plain tuple, built once per message on the hot path.
DispatchItem = tuple[int, int, int, int, list[tuple[str, int, int]], tuple[bytes, ...]]


class Dispatcher:
    def __init__(self, index: ConsumeQueueIndex, notify: NotifyHub) -> None:
        self._index = index
        self._notify = notify

    def dispatch(self, items: list[DispatchItem], end_position: int, heads: dict[str, int] | None = None) -> None:
        """Index ``items`` (in commitlog order) and advance the checkpoint to ``end_position``.

        ``heads``: each queue the items go to -> pack_state(qid, its next offset after them),
        as the committer assigned them; computed here when not given (recovery)."""
        if heads is None:
            heads = {name: (offset + 1) << 32 | qid for *_, targets, _ in items for name, qid, offset in targets}
        batch = self._index.new_batch()
        put = batch.put
        pack_key = ENTRY_KEY.pack
        pack_value = ENTRY_VALUE.pack
        for position, size, tag, store_ts, targets, keys in items:
            value = pack_value(position, size, tag, store_ts)
            for name, qid, offset in targets:
                put(pack_key(ENTRY_PREFIX, qid, offset), value)
            for prefix in keys:
                put(*key_entry(prefix, position, store_ts))
        self._index.commit(batch, end_position)
        self._index.cache.update(heads)
        self._index.trim_cache()
        if self._notify.active:
            self._notify.publish({name: packed >> 32 for name, packed in heads.items()})
