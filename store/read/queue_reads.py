"""A read of a queue from an offset (``MessageStore.get_now``'s work): its consume-queue entries,
then their records from the commitlog; with tag hashes, RocketMQ's consume-queue filter, which
leaves the commitlog untouched for the entries it skips."""

from __future__ import annotations

from ..index.consumequeue import ENTRY_VALUE, ConsumeQueueIndex, QueueState
from ..index.first_offsets import FirstOffsets
from ..log.commitlog import CommitLog
from ..messages import GetResult, GetStatus
from .reads import read_entries

# entries a filtered get examines at most (RocketMQ scans 16,000 bytes of consume queue: 800)
FILTER_SCAN = 800


def read_queue(index: ConsumeQueueIndex, commitlog: CommitLog, first_offsets: FirstOffsets, id_prefix: str,
               queue: str, offset: int, max_messages: int, max_bytes: int,
               tag_hashes: frozenset[int] | None) -> GetResult:
    """Up to ``max_messages`` of ``queue`` from ``offset`` (at least one, at most ``max_bytes``
    after the first), with the statuses ``MessageStore.get_now`` documents."""
    state = index.lookup(queue)
    if state is None:
        return GetResult(GetStatus.NO_SUCH_QUEUE, [], 0, 0, 0)
    max_offset = state.next_offset
    if offset >= max_offset or offset < 0:
        low = first_offsets.of(state.qid, max_offset)
        if offset < 0:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
        status = GetStatus.NO_NEW_MESSAGE if offset == max_offset else GetStatus.OFFSET_OVERFLOW
        return GetResult(status, [], max_offset, low, max_offset)
    if tag_hashes is not None:
        return _read_filtered(index, commitlog, first_offsets, id_prefix, state, queue, offset, max_messages,
                              max_bytes, tag_hashes)
    raws = index.entries(state.qid, offset, min(max_messages, max_offset - offset))
    min_position = commitlog.min_position
    unpack = ENTRY_VALUE.unpack
    entries = []
    for raw in raws:
        if raw is None:
            break
        entry = unpack(raw)
        if entry[0] < min_position:
            break
        entries.append(entry)
    low = first_offsets.of(state.qid, max_offset)
    if not entries:
        if offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
        return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, low, max_offset)
    messages = read_entries(commitlog, id_prefix, queue, range(offset, offset + len(entries)), entries, max_bytes)
    return GetResult(GetStatus.FOUND, messages, offset + len(messages), low, max_offset)


def _read_filtered(index: ConsumeQueueIndex, commitlog: CommitLog, first_offsets: FirstOffsets, id_prefix: str,
                   state: QueueState, queue: str, offset: int, max_messages: int, max_bytes: int,
                   tag_hashes: frozenset[int]) -> GetResult:
    max_offset = state.next_offset
    low = first_offsets.of(state.qid, max_offset)
    if offset < low:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, max_offset)
    raws = index.entries(state.qid, offset, min(FILTER_SCAN, max_offset - offset))
    unpack = ENTRY_VALUE.unpack
    offsets: list[int] = []
    entries = []
    scanned_to = offset
    for i, raw in enumerate(raws):
        if raw is None:
            break
        entry = unpack(raw)
        scanned_to = offset + i + 1
        if entry[2] in tag_hashes:
            offsets.append(offset + i)
            entries.append(entry)
            if len(entries) >= max_messages:
                break
    if not entries:
        return GetResult(GetStatus.NO_MATCHED_MESSAGE, [], scanned_to, low, max_offset)
    messages = read_entries(commitlog, id_prefix, queue, offsets, entries, max_bytes)
    if len(messages) < len(entries):  # cut short by max_bytes: go on after the last one read
        scanned_to = messages[-1].queue_offset + 1
    return GetResult(GetStatus.FOUND, messages, scanned_to, low, max_offset)
