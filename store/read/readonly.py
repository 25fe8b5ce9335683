"""Read a data directory that another process (the running gateway) writes: read-only, lock-free.

Two parts, used by the bulk read paths (``store/read/columns.py``):

- ``CommitLogReader``: its own read-only maps of the commitlog segment files. The gateway's read
  API uses it too, from a worker thread, so that bulk reads never touch the maps the store's
  event-loop thread re-creates (a map closed under a reader raises).
- ``StoreReader``: a ``CommitLogReader`` plus the consume-queue index opened as a RocksDB
  *secondary* instance (its own info log lives in a temporary directory). It never takes the
  store's ``LOCK`` and writes nothing into the data directory, with one exception we cannot
  avoid: rocksdict rewrites ``index/rocksdict-config.json`` with the same bytes when it opens.

What a secondary sees: the index runs with RocksDB's WAL off, so a secondary sees only flushed
memtables (the store flushes its index every ``index_flush_interval`` and whenever a write
buffer fills). Queue rows and their entries are written in one batch and flushed together, so
the next offset a secondary reads in a queue row never runs ahead of the entries (and records)
it can read: offsets this reader offers are always readable by it. The price is staleness, by
up to the index flush interval.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Self

from rocksdict import AccessType, Options, Rdict

from ..log.commitlog import LAYOUT_FILE, SEGMENT_NAME_DIGITS, widen_map
from ..index.consumequeue import NAME_PREFIX, QUEUE_ROW, ConsumeQueueIndex, QueueState, queue_end
from ..errors import StoreError


class CommitLogReader:
    """Read-only maps of the commitlog segments; ``refresh()`` picks up new and deleted segments.

    A segment deleted by retention stays readable through a map made before the deletion (the
    file is unlinked, not cut), but ``min_position`` says it is gone: callers treat positions
    below it as lost, as the store does.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            self.segment_size = int((directory / LAYOUT_FILE).read_text().strip())
        except (OSError, ValueError) as exc:
            raise StoreError(f"{directory} is not a TideMQ commitlog: {exc}") from None
        self._starts: list[int] = []
        self._maps: dict[int, mmap.mmap] = {}
        self.refresh()

    def refresh(self) -> None:
        starts = sorted(
            int(p.name) for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == SEGMENT_NAME_DIGITS
        )
        for start in [s for s in self._maps if s not in starts]:
            del self._maps[start]  # closed when the last array over it goes
        self._starts = starts

    @property
    def min_position(self) -> int:
        return self._starts[0] if self._starts else 0

    def span(self, start: int, lo: int, hi: int) -> tuple[mmap.mmap | bytes, int] | None:
        """Bytes [lo, hi) of the segment starting at ``start`` as (buffer, base): they are
        ``buffer[lo - base:hi - base]``. The buffer is the segment's map, or, for the newest
        bytes of the active segment, a ``pread`` copy of just them (the commitlog's rule,
        ``widen_map``: no re-map per read of new data). None when the segment is gone or does
        not hold ``hi`` bytes."""
        mapped = self._maps.get(start)
        if mapped is not None and len(mapped) >= hi:
            return mapped, 0
        path = self.directory / f"{start:0{SEGMENT_NAME_DIGITS}d}"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < hi or size == 0:
                return None
            sealed = bool(self._starts) and start < self._starts[-1]
            if not widen_map(len(mapped) if mapped is not None else 0, size, hi - lo, sealed):
                return os.pread(fd, hi - lo, lo), lo
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._maps[start] = mapped  # the old, shorter map closes when nothing uses it
        return mapped, 0

    def pieces(self, start: int, spans: list[tuple[int, int]]) -> list[bytes] | None:
        """Bytes [lo, hi) of the segment starting at ``start`` for each span, copied: from its
        map where that holds them, else a ``pread`` each through one opening of the file (for
        records far apart, where ``span`` would copy everything between them). None when the
        segment is gone or does not hold them all."""
        if not spans:
            return []
        top = max(hi for _, hi in spans)
        mapped = self._maps.get(start)
        if mapped is not None and len(mapped) >= top:
            return [mapped[lo:hi] for lo, hi in spans]
        try:
            fd = os.open(self.directory / f"{start:0{SEGMENT_NAME_DIGITS}d}", os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size < top:
                return None
            return [os.pread(fd, hi - lo, lo) for lo, hi in spans]
        finally:
            os.close(fd)

    def close(self) -> None:
        self._maps.clear()


class SecondaryIndex(ConsumeQueueIndex):
    """The consume-queue index opened as a RocksDB secondary: reads only, nothing cached (the
    primary moves on underneath; ``catch_up()`` brings this view forward)."""

    def __init__(self, path: Path) -> None:  # not super().__init__(): that opens the primary
        if not (path / "CURRENT").exists():
            raise StoreError(f"{path} is not a TideMQ consume-queue index (no CURRENT file)")
        _sweep_secondary_dirs()
        self._secondary_dir = tempfile.mkdtemp(prefix=f"{SECONDARY_PREFIX}{os.getpid()}-")
        opts = Options(raw_mode=True)
        opts.set_max_open_files(-1)  # a secondary must keep files the primary compacts away open
        try:
            self._db = Rdict(str(path), opts, access_type=AccessType.secondary(self._secondary_dir))
        except Exception:
            shutil.rmtree(self._secondary_dir, ignore_errors=True)
            raise
        self.cache = {}  # stays empty: lookups always read the (caught-up) database
        self._cache_entries = 16
        self.dispatched_position, self._next_qid = 0, 0

    def catch_up(self) -> None:
        self._db.try_catch_up_with_primary()

    def _load(self, name: str) -> int | None:
        raw = self._db.get(NAME_PREFIX + name.encode())
        if raw is None:
            return None
        qid = QUEUE_ROW.unpack(raw)[0]
        return queue_end(self._db, qid, raw)[0] << 32 | qid

    def resolve(self, name: str) -> int:
        raise StoreError("a secondary index is read-only")

    def close(self) -> None:
        try:
            self._db.close()
        finally:
            shutil.rmtree(self._secondary_dir, ignore_errors=True)


SECONDARY_PREFIX = "tidemq-secondary-"


def _sweep_secondary_dirs() -> None:
    """Remove the secondary directories of processes that are gone (Spark ends its Python
    workers without running their clean-up)."""
    root = Path(tempfile.gettempdir())
    for path in root.glob(f"{SECONDARY_PREFIX}*-*"):
        pid = path.name[len(SECONDARY_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, someone else's
            pass


def first_readable_offset(index: ConsumeQueueIndex, state: QueueState, min_position: int) -> int:
    """The queue's first offset whose record is still in the commitlog (the store's rule for its
    minimum offset: entries may outlive the segments they point into until cleaned)."""
    first = index.first_offset(state.qid)
    if first is None:
        return state.next_offset
    entry = index.entry(state.qid, first)
    if entry is None or entry[0] < min_position:
        first = index.first_offset_at_or_after_position(state.qid, first, state.next_offset, min_position)
    return first


class StoreReader:
    """A read-only view of a data directory: queue offsets and bulk reads, while a gateway runs.

    Not thread-safe; one per process (or per thread) is plenty.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.commitlog = CommitLogReader(self.data_dir / "commitlog")
        self.index = SecondaryIndex(self.data_dir / "index")

    def refresh(self) -> None:
        """See what the writer has flushed since the last refresh (index first, then the
        commitlog's segment list, so a segment deleted after the index caught up counts as gone)."""
        self.index.catch_up()
        self.commitlog.refresh()

    def queue(self, name: str) -> QueueState | None:
        return self.index.lookup(name)

    def queues(self, prefix: str = "") -> list[QueueState]:
        return [state for state, _ in self.index.iter_queues(prefix)]

    def offsets(self, name: str) -> tuple[int, int] | None:
        """(first readable offset, next offset) of a queue as this reader sees it, or None."""
        state = self.index.lookup(name)
        if state is None:
            return None
        return first_readable_offset(self.index, state, self.commitlog.min_position), state.next_offset

    def close(self) -> None:
        self.index.close()
        self.commitlog.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
