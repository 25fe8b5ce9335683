"""RocksDB options of the store's two databases (index, meta), within one memory budget.

Left to their defaults, each database has its own block cache, keeps the index and bloom-filter
blocks of every open table file outside it (they grow with the data stored: ~1.25 bytes of
filter per index entry) and, for meta, 64 MiB write buffers. Here both share one LRU block cache
that also holds index and filter blocks, and one write-buffer manager that flushes memtables
when together they reach their budget, so RocksDB's memory is about
``cache_bytes + write_buffer_bytes`` whatever the volume stored.
"""

from __future__ import annotations

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

# The index's memtable is a quarter of the write-buffer budget (8 MiB at the default 32 MiB, the
# size it had before there was a budget), meta's an eighth (its writes are small: offsets,
# sessions, retained positions); two of each (one filling, one flushing) fit in the budget.
INDEX_SHARE = 4
META_SHARE = 8


class RocksMemory:
    """The block cache and write-buffer manager every database of one store shares."""

    def __init__(self, cache_bytes: int, write_buffer_bytes: int) -> None:  # (StoreOptions checks them)
        self.cache_bytes = cache_bytes
        self.write_buffer_bytes = write_buffer_bytes
        self.cache = Cache(cache_bytes)
        # allow_stall=False: writes are never blocked on memory; the manager only flushes early
        self.write_buffers = WriteBufferManager(write_buffer_bytes, False)

    def options(self, *, share: int, bloom: bool) -> Options:
        """Options of one database whose memtable is ``write_buffer_bytes / share``; ``bloom``
        adds whole-key bloom filters (tables and memtable) for lookups that mostly miss."""
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(self.write_buffer_bytes // share)
        opts.set_max_write_buffer_number(2)
        opts.set_write_buffer_manager(self.write_buffers)
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        # Index and filter blocks count against the cache instead of living beside it, one set
        # per table file; those of level 0 (the newest, most read files) stay pinned there.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        if bloom:
            table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        if bloom:
            opts.set_memtable_whole_key_filtering(True)
            opts.set_memtable_prefix_bloom_ratio(0.02)
        return opts
