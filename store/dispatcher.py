"""The dispatcher (RocketMQ's ReputMessageService): commitlog records -> consume-queue entries.

Each batch of records becomes ONE RocksDB WriteBatch holding every entry, the message-key
index entries, the updated queue rows and the checkpoint (the commitlog position up to which all is indexed);
only after it is written do readers see the new offsets and does notify fire.
"""

from __future__ import annotations

from .consumequeue import ENTRY_KEY, ENTRY_PREFIX, ENTRY_VALUE, NAME_PREFIX, QUEUE_ROW, ConsumeQueueIndex
from .keyindex import entry as key_entry
from .notify import NotifyHub


# (commitlog position, record size, tag hash, store timestamp, [(queue, qid, offset in it)],
# key-index prefixes): a plain tuple, built once per message on the hot path.
DispatchItem = tuple[int, int, int, int, list[tuple[str, int, int]], tuple[bytes, ...]]


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
        pack_row = QUEUE_ROW.pack
        newest: dict[str, tuple[int, int, int]] = {}
        for position, size, tag, store_ts, targets, keys in items:
            value = pack_value(position, size, tag, store_ts)
            for name, qid, offset in targets:
                put(pack_key(ENTRY_PREFIX, qid, offset), value)
                newest[name] = (qid, offset, position)
            for prefix in keys:
                put(*key_entry(prefix, position, store_ts))
        for name, (qid, offset, position) in newest.items():
            put(NAME_PREFIX + name.encode(), pack_row(qid, offset + 1, position))
        self._index.commit(batch, end_position)
        cache = self._index.cache
        for name, (qid, offset, _) in newest.items():
            cache[name] = (offset + 1) << 32 | qid  # pack_state, inlined on the hot path
        self._index.trim_cache()
        if self._notify.active:
            self._notify.publish({name: offset + 1 for name, (_, offset, _) in newest.items()})
