"""RocksDB options of the store's two databases (index, meta), within one memory budget.

Left to their defaults, each database has its own block cache, keeps the index and bloom-filter
blocks of every open table file outside it (they grow with the data stored: ~1.25 bytes of
filter per index entry) and, for meta, 64 MiB write buffers. Here both share one LRU block cache
that also holds index and filter blocks, and one write-buffer manager that flushes memtables
when together they reach their budget, so RocksDB's memory is about
``cache_bytes + write_buffer_bytes`` whatever the volume stored.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any, cast

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, Options, Rdict, ReadOptions, WriteBufferManager

log = logging.getLogger("tidemq.store.rocks")

# The index's memtable is a quarter of the write-buffer budget (8 MiB at the default 32 MiB, the
# size it had before there was a budget), meta's an eighth (its writes are small: offsets,
# sessions, retained positions); two of each (one filling, one flushing) fit in the budget.
INDEX_SHARE = 4
META_SHARE = 8
# Memtables grow by arena blocks of this size, allocated with malloc and all freed together
# when the memtable is flushed.
ARENA_BLOCK_BYTES = 1 << 20
# glibc serves an allocation this large or larger with its own mmap, given back to the system
# when freed. Left alone, glibc raises the threshold to the size of each mmapped block freed,
# so after the first memtable flush its blocks came from the heap, where the small long-lived
# allocations placed between them kept the freed space from ever shrinking: the heap grew by
# ~20 MiB in 4 minutes under the soak's load while the memory in use stayed flat. Fixed
# (which also stops the raising) between asyncio's 256 KiB socket reads, left on the heap, and
# the arena blocks.
MMAP_THRESHOLD_BYTES = 512 << 10
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold for the process (see MMAP_THRESHOLD_BYTES); False where the C
    library is not glibc (nothing to do: the dynamic threshold is glibc's)."""
    libc = _glibc()
    if libc is None:
        return False
    done = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not done:
        log.warning("could not fix the malloc mmap threshold bytes=%d", MMAP_THRESHOLD_BYTES)
    return done


def raw_items(db: Rdict, from_key: bytes, read_opt: ReadOptions | None = None) -> Iterator[tuple[bytes, bytes]]:
    """``db.items`` from ``from_key`` of a database opened in raw mode, whose keys and values
    are bytes (rocksdict types them as any key it can encode)."""
    return cast("Iterator[tuple[bytes, bytes]]", db.items(from_key=from_key, read_opt=read_opt))


def raw_keys(db: Rdict, from_key: bytes, read_opt: ReadOptions | None = None) -> Iterator[bytes]:
    """``db.keys`` from ``from_key`` of a database opened in raw mode (see ``raw_items``)."""
    return cast("Iterator[bytes]", db.keys(from_key=from_key, read_opt=read_opt))


def raw_multi_get(db: Rdict, keys: list[bytes]) -> list[bytes | None]:
    """``db[keys]`` of a database opened in raw mode: each key's value, None where it has none."""
    return cast("list[bytes | None]", db[cast("list[Any]", keys)])


def property_sum(dbs: Iterable[Rdict], name: str) -> int:
    """The sum of an integer property (``rocksdb.cur-size-all-mem-tables``, ...) over ``dbs``;
    a closed database, or one without the property, counts 0."""
    total = 0
    for db in dbs:
        try:
            total += db.property_int_value(name) or 0
        except Exception:  # (rocksdict raises its own error for a closed database)
            pass
    return total


def release_free_memory() -> bool:
    """Give the free pages inside glibc's malloc arenas back to the system; False where the C
    library is not glibc.

    RocksDB's compaction thread allocates its short-lived buffers (tens of MiB for a large
    compaction) in its own malloc arena, among the long-lived blocks it also allocates there
    (table readers, cache entries). Those keep glibc from shrinking the arena, so each larger
    compaction raised the process's memory for good: in the mixed soak the compaction thread's
    arena held 31 MiB with 1.3 MiB in use. malloc_trim returns the free pages of every arena
    (madvise), whatever lies above them.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


class RocksMemory:
    """The block cache and write-buffer manager every database of one store shares."""

    def __init__(self, cache_bytes: int, write_buffer_bytes: int) -> None:  # (StoreOptions checks them)
        self.cache_bytes = cache_bytes
        self.write_buffer_bytes = write_buffer_bytes
        self.cache = Cache(cache_bytes)
        # allow_stall=False: writes are never blocked on memory; the manager only flushes early
        self.write_buffers = WriteBufferManager(write_buffer_bytes, False)
        fix_mmap_threshold()

    def options(self, *, share: int, bloom: bool) -> Options:
        """Options of one database whose memtable is ``write_buffer_bytes / share``; ``bloom``
        adds whole-key bloom filters (tables and memtable) for lookups that mostly miss."""
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(self.write_buffer_bytes // share)
        opts.set_max_write_buffer_number(2)
        opts.set_write_buffer_manager(self.write_buffers)
        opts.set_arena_block_size(ARENA_BLOCK_BYTES)
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        # Index and filter blocks count against the cache instead of living beside it, one set
        # per table file; those of level 0 (the newest, most read files) stay pinned there.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        # ... in partitions of a few KiB, under a small top-level index pinned in the cache. A
        # cache is cut in shards of 512 KiB (64 of them at 32 MiB), and a block larger than its
        # shard does not stay: a table's whole filter (10 bits per key, over 512 KiB once a table
        # holds 420,000 keys) was read again, into a fresh mmap, by every lookup that reached
        # the table -- each new queue's name lookup (1,000,000 random queues: 4,000-9,000
        # msgs/s, half of it system time; partitioned: ~85,000).
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_pin_top_level_index_and_filter(True)
        if bloom:
            table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        if bloom:
            opts.set_memtable_whole_key_filtering(True)
            opts.set_memtable_prefix_bloom_ratio(0.02)
        return opts
