"""Small durable tables beside the index: consumer offsets and named KV tables.

They live in their own RocksDB with its WAL on (unlike the index, nothing else can
rebuild them): a write survives a process crash at once, and a machine crash too when
the store runs in ``sync`` flush mode.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Iterable, Iterator

from rocksdict import Rdict, WriteOptions

from ..errors import StoreWriteError
from ..rocks import META_SHARE, RocksMemory, raw_items, raw_keys
from .journal import MetaBatch

log = logging.getLogger("tidemq.store")

_NO_SYNC = WriteOptions()  # (sync off: the WAL is written, not fsynced)
OFFSET_PREFIX = b"o"
DROPPED_PREFIX = b"d"  # queue name -> the commitlog position of its drop record (retention/reclaim.py)
TABLE_PREFIX = b"t"
PROBE_KEY = b"w"  # written by ``probe``
SEP = b"\x00"
_U64 = struct.Struct(">Q")


class MetaWrites:
    """Every write to the meta database, as a MetaBatch (meta/journal.py): told to ``journal``
    first when set (a replicated leader puts it in the commitlog for its followers), then applied.
    RocksDB's failure (a full disk, an I/O error) becomes StoreWriteError. After a failed log
    write RocksDB refuses every write until it recovers by itself (from ENOSPC: once space is
    free), so ``failed`` holds the failure until a write succeeds again; both moments are logged
    once."""

    def __init__(self, db: Rdict) -> None:
        self.db = db
        self.failed: StoreWriteError | None = None
        self.journal: Callable[[MetaBatch], None] | None = None

    def apply(self, batch: MetaBatch, *, sync: bool | None = None, journal: bool = True) -> None:
        """Apply ``batch`` (``sync`` False: the WAL is not fsynced, whatever the flush mode;
        ``journal`` False: housekeeping every replica does by itself, not told to followers)."""
        if not batch.changes:
            return
        if journal and self.journal is not None:
            batch = batch.with_before(self.db.get, self._keys_in)
            self.journal(batch)
        self._call(self.db.write, batch.write_batch(), *((_NO_SYNC,) if sync is False else ()))

    def _keys_in(self, start: bytes, end: bytes) -> Iterator[bytes]:
        for key in raw_keys(self.db, start):
            if key >= end:
                break
            yield key

    def flush(self) -> None:
        self._call(self.db.flush, True)

    def _call(self, write: Callable[..., Any], *args: Any) -> Any:
        try:
            done = write(*args)
        except Exception as exc:  # (rocksdict raises a plain Exception carrying RocksDB's status)
            failure = StoreWriteError(f"meta write failed: {exc}")
            if self.failed is None:
                log.error("meta write failed; sessions, retained messages, offsets and declarations are "
                          "not written until it recovers error=%s", exc)
            self.failed = failure
            raise failure from None
        if self.failed is not None:
            self.failed = None
            log.warning("meta writes resumed")
        return done


class MetaStore:
    """``before_write``: called before each durable write (MessageStore: the commitlog made
    durable first in ``sync`` mode, so that offsets never name messages a machine crash loses)."""

    def __init__(self, path: Path, *, sync: bool, memory: RocksMemory,
                 before_write: Callable[[], None] | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._before_write = before_write or _nothing
        self._db = Rdict(str(path), memory.options(share=META_SHARE, bloom=False))
        wo = WriteOptions()
        wo.sync = sync
        self._db.set_write_options(wo)
        self.writes = MetaWrites(self._db)

    @property
    def failed(self) -> StoreWriteError | None:
        """Why the last write failed (None: it did not): meta takes no writes meanwhile."""
        return self.writes.failed

    def probe(self) -> None:
        """One small write, to learn whether meta takes writes again after a failure."""
        self.writes.apply(MetaBatch().put(PROBE_KEY, b""), journal=False)

    @property
    def db(self) -> Rdict:
        return self._db

    def table(self, name: str) -> "KvTable":
        if not name or "\x00" in name:
            raise ValueError("table names are non-empty and have no NUL")
        return KvTable(self._db, TABLE_PREFIX + name.encode() + SEP, self._before_write, self.writes)

    # -- consumer offsets -----------------------------------------------------------------
    @staticmethod
    def _offset_key(consumer: str, queue: str) -> bytes:
        return OFFSET_PREFIX + consumer.encode() + SEP + queue.encode()

    def load_offset(self, consumer: str, queue: str) -> int | None:
        raw = self._db.get(self._offset_key(consumer, queue))
        return _U64.unpack(raw)[0] if raw is not None else None

    def save_offsets(self, offsets: dict[tuple[str, str], int]) -> None:
        batch = MetaBatch()
        for (consumer, queue), offset in offsets.items():
            batch.put(self._offset_key(consumer, queue), _U64.pack(offset))
        self._before_write()
        self.writes.apply(batch)

    def delete_offsets(self, consumer: str) -> None:
        prefix = OFFSET_PREFIX + consumer.encode() + SEP
        self.writes.apply(MetaBatch().delete_range(prefix, prefix[:-1] + b"\x01"))

    def iter_offsets(self, consumer: str) -> Iterator[tuple[str, int]]:
        prefix = OFFSET_PREFIX + consumer.encode() + SEP
        for key, raw in raw_items(self._db, prefix):
            if not key.startswith(prefix):
                break
            yield key[len(prefix) :].decode(), _U64.unpack(raw)[0]

    def delete_offsets_of(self, queues: set[str], position: int) -> None:
        """Every consumer's offset of these queues, removed by the drop records ending at
        ``position`` (retention/reclaim.py), and a marker per queue in the same batch: re-dispatch after a
        crash meets the drop records again, and must not delete what was saved for a new queue
        of the same name after them (meta has its own log). A scan of all offsets."""
        doomed = {name for name in queues
                  if (raw := self._db.get(DROPPED_PREFIX + name.encode())) is None or _U64.unpack(raw)[0] < position}
        if not doomed:
            return
        batch = MetaBatch()
        for key in raw_keys(self._db, OFFSET_PREFIX):
            if not key.startswith(OFFSET_PREFIX):
                break
            if key[key.index(SEP) + 1:].decode() in doomed:
                batch.delete(key)
        for name in doomed:
            batch.put(DROPPED_PREFIX + name.encode(), _U64.pack(position))
        self._before_write()
        self.writes.apply(batch, journal=False)  # (every replica does it when it indexes the drop records)

    def forget_drops_below(self, position: int) -> None:
        """Markers of drops the index has made durable (re-dispatch starts after them)."""
        batch = MetaBatch()
        for key, raw in raw_items(self._db, DROPPED_PREFIX):
            if not key.startswith(DROPPED_PREFIX):
                break
            if _U64.unpack(raw)[0] <= position:
                batch.delete(key)
        self.writes.apply(batch, journal=False)

    def flush(self) -> None:
        self.writes.flush()

    def close(self) -> None:
        try:
            self._db.close()
        except Exception as exc:  # (after a failed write RocksDB reports it again, and closes)
            if self.writes.failed is None:
                raise
            log.warning("meta closed after a failed write error=%s", exc)


class KvTable:
    """A named durable map of str -> bytes (retained messages, sessions, metadata)."""

    def __init__(self, db: Rdict, prefix: bytes, before_write: Callable[[], None], writes: MetaWrites) -> None:
        self._db = db
        self._prefix = prefix
        self._before_write = before_write
        self._writes = writes

    def get(self, key: str) -> bytes | None:
        return self._db.get(self._prefix + key.encode())

    async def load(self, key: str) -> bytes | None:
        """``get``, for callers written for tables that are read over a network."""
        return self.get(key)

    def put(self, key: str, value: bytes) -> None:
        self._before_write()
        self._writes.apply(MetaBatch().put(self._prefix + key.encode(), value))

    def put_hint(self, key: str, value: bytes) -> None:
        """``put`` without waiting for the disk, whatever the flush mode: in the WAL, so it
        survives a crash of the process, not always one of the machine. For what only hints (an
        AMQP queue's delivered mark): in ``sync`` mode a put is an fsync on the caller's thread."""
        self._writes.apply(MetaBatch().put(self._prefix + key.encode(), value), sync=False)

    def put_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Several puts in one write (one WAL record: all or none after a crash)."""
        batch = MetaBatch()
        for key, value in items:
            batch.put(self._prefix + key.encode(), value)
        self._before_write()
        self._writes.apply(batch)

    def delete(self, key: str) -> None:
        self._writes.apply(MetaBatch().delete(self._prefix + key.encode()))

    def names(self, prefix: str = "") -> Iterator[str]:
        return (key for key, _ in self.items(prefix))

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        start = self._prefix + prefix.encode()
        cut = len(self._prefix)
        for key, value in raw_items(self._db, start):
            if not key.startswith(start):
                break
            yield key[cut:].decode(), value


def _nothing() -> None:
    pass
