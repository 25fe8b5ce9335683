"""Tuning of the store; the gateway's configuration fills this in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FlushMode = Literal["sync", "async"]
MIN_ROCKSDB_CACHE_BYTES = 1 << 20
MIN_ROCKSDB_WRITE_BUFFER_BYTES = 16 << 20  # meta's memtable: two arena blocks (store/rocks.py)


@dataclass(slots=True)
class StoreOptions:
    data_dir: Path
    segment_size: int = 1 << 30
    flush: FlushMode = "async"
    flush_interval: float = 0.2  # seconds between fdatasyncs in async mode
    checkpoint_interval: float = 5.0  # consumer offsets
    index_flush_interval: float = 60.0  # bounds the re-dispatch work of a crash recovery
    max_message_size: int = 20 << 20  # a record: body, topic, properties and queue list
    queue_cache_entries: int = 1_048_576  # hot queue states kept in memory
    # RocksDB's memory (index and meta together, store/rocks.py): one block cache that also
    # holds index and bloom-filter blocks, and a budget for memtables
    rocksdb_cache_bytes: int = 32 << 20
    rocksdb_write_buffer_bytes: int = 32 << 20
    # seconds between returns of free malloc pages to the system (store/rocks.py
    # release_free_memory: RocksDB's compactions leave them behind); 0 = never
    memory_release_interval: float = 10.0
    retention_hours: float = 72.0  # 0 = keep by age forever
    retention_bytes: int = 0  # 0 = no size limit
    retention_check_interval: float = 60.0
    queue_idle_check_interval: float = 600.0  # how often idle light queues are looked for (retention/reclaim.py)
    identity_host: str = "127.0.0.1"  # encoded in message ids (RocketMQ offsetMsgId)
    identity_port: int = 10911
    repair: bool = False
    # a replica of a replicated group (store/replica/): recovery indexes nothing beyond the index's
    # checkpoint, which never passes what the group confirmed; the rest waits for the group to say
    replicated: bool = False

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.flush not in ("sync", "async"):
            raise ValueError(f"flush must be 'sync' or 'async', not {self.flush!r}")
        if self.segment_size < 4096:
            raise ValueError("segment_size must be at least 4096 bytes")
        if self.rocksdb_cache_bytes < MIN_ROCKSDB_CACHE_BYTES:
            raise ValueError(f"rocksdb_cache_bytes must be at least {MIN_ROCKSDB_CACHE_BYTES} bytes")
        if self.rocksdb_write_buffer_bytes < MIN_ROCKSDB_WRITE_BUFFER_BYTES:
            raise ValueError(f"rocksdb_write_buffer_bytes must be at least {MIN_ROCKSDB_WRITE_BUFFER_BYTES} bytes")
        if self.memory_release_interval < 0:
            raise ValueError("memory_release_interval must be 0 (never) or a number of seconds")
        if self.max_message_size > self.segment_size:
            self.max_message_size = self.segment_size
