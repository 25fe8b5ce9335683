"""The commitlog: segmented append-only files holding every record once, in arrival order.

Positions are global byte offsets. Segment files are named by their start position
(20 digits, as RocketMQ names them) and start at multiples of the segment size; a
record never spans two segments: when it does not fit, the log rolls to the next
segment and the tail of the old one stays unused. Writes use ``pwrite`` at a known
position so a failed write can be cut back with ``ftruncate`` and leaves no partial
record behind.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import MessageTooLargeError, StoreError, StoreWriteError

log = logging.getLogger("tidemq.store.commitlog")

SEGMENT_NAME_DIGITS = 20
LAYOUT_FILE = "SEGMENT_SIZE"
# A segment's read map is widened once this much has been written past it; until then reads of
# the unmapped tail use pread. Re-mapping at each read of new data remapped the active segment
# (up to segment_size, 1 GiB by default) ~100 times a second under the mixed soak, on the event
# loop's thread: measured here, one remap of a 350 MiB map whose pages were read costs 1.3 ms
# (1 GiB: 3.6 ms, mostly munmap tearing down page tables), a 250-byte pread 0.5 us against
# 0.2 us for a slice of the map. A larger step means fewer of those multi-ms stalls (32 per
# GiB written); a smaller one a smaller pread region (reads of the newest bytes while the log
# is quiet pay the 0.3 us).
MAP_STEP = 32 << 20


@dataclass(slots=True)
class Segment:
    start: int
    path: Path
    fd: int
    length: int  # bytes of the file that hold records (the file's size)
    view: mmap.mmap | None = None  # read-only map of the first `mapped` bytes
    mapped: int = 0

    def unmap(self) -> None:
        """Drop the read map (before the file shrinks: touching a page past EOF is SIGBUS)."""
        if self.view is not None:
            self.view.close()
            self.view = None
            self.mapped = 0


class CommitLog:
    def __init__(self, directory: Path, segment_size: int) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.segment_size = segment_size = _fixed_segment_size(directory, segment_size)
        self._segments: dict[int, Segment] = {}
        self._order: list[int] = []
        for path in sorted(directory.iterdir()):
            if path.name.isdigit() and len(path.name) == SEGMENT_NAME_DIGITS:
                start = int(path.name)
                if start % segment_size:
                    raise StoreError(
                        f"segment {path} does not start at a multiple of the segment size {segment_size}"
                    )
                self._add_segment(start, path)
        if not self._order:
            self._create_segment(0)
        last = self._segments[self._order[-1]]
        self._end = last.start + last.length
        self._dirty: set[int] = set()
        self._flushed = self._end
        self._flush_lock = threading.Lock()

    # -- layout ------------------------------------------------------------------------
    @property
    def min_position(self) -> int:
        return self._order[0]

    @property
    def end_position(self) -> int:
        """Position the next record will be written at (end of the valid data)."""
        return self._end

    @property
    def flushed_position(self) -> int:
        return self._flushed

    def segments(self) -> list[Segment]:
        return [self._segments[s] for s in self._order]

    def segment_of(self, position: int) -> Segment | None:
        return self._segments.get(position - position % self.segment_size)

    def total_bytes(self) -> int:
        return sum(s.length for s in self._segments.values())

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:0{SEGMENT_NAME_DIGITS}d}"

    def _add_segment(self, start: int, path: Path) -> Segment:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        seg = Segment(start, path, fd, os.fstat(fd).st_size)
        self._segments[start] = seg
        self._order.append(start)
        return seg

    def _create_segment(self, start: int) -> Segment:
        seg = self._add_segment(start, self._path(start))
        fsync_dir(self.directory)
        return seg

    # -- writing -----------------------------------------------------------------------
    def append(self, records: Sequence[bytes]) -> list[int]:
        """Write records in order; return each one's position. All or nothing.

        Raises StoreWriteError (the log is left exactly as it was) or MessageTooLargeError.
        """
        seg_size = self.segment_size
        pos = self._end
        seg_start = pos - pos % seg_size
        positions: list[int] = []
        pieces: list[tuple[int, int, list[bytes]]] = []  # (segment start, file offset, chunks)
        chunk: list[bytes] = []
        chunk_from = pos
        for rec in records:
            n = len(rec)
            if n > seg_size:
                raise MessageTooLargeError(f"record of {n} bytes exceeds segment size {seg_size}")
            if pos - seg_start + n > seg_size:
                if chunk:
                    pieces.append((seg_start, chunk_from - seg_start, chunk))
                seg_start += seg_size
                pos = chunk_from = seg_start
                chunk = []
            positions.append(pos)
            chunk.append(rec)
            pos += n
        if chunk:
            pieces.append((seg_start, chunk_from - seg_start, chunk))

        before = {start: seg.length for start, seg in self._segments.items() if start >= self._order[-1]}
        created: list[int] = []
        try:
            for start, file_offset, chunks in pieces:
                seg = self._segments.get(start)
                if seg is None:
                    seg = self._create_segment(start)
                    created.append(start)
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                _pwrite_all(seg.fd, data, file_offset)
                seg.length = file_offset + len(data)
                self._dirty.add(start)
        except OSError as exc:
            self._roll_back(before, created)
            raise StoreWriteError(f"commitlog write failed: {os.strerror(exc.errno or errno.EIO)}") from exc
        self._end = pos
        return positions

    def append_at(self, position: int, data: bytes) -> None:
        """Write a leader's bytes where its log holds them (a follower, store/replica/): at the
        end, or at the start of the next segment when the leader rolled there. ``data`` never
        crosses a segment's end. All or nothing, as ``append``."""
        size = self.segment_size
        seg_start = position - position % size
        current = self._end - self._end % size
        if position != self._end and not (position == seg_start == current + size):
            raise StoreWriteError(f"replicated bytes at {position} do not follow the log's end {self._end}")
        if position - seg_start + len(data) > size:
            raise StoreWriteError(f"replicated bytes at {position} cross the end of their segment")
        seg = self._segments.get(seg_start)
        created = seg is None
        before = {start: s.length for start, s in self._segments.items() if start >= self._order[-1]}
        try:
            if seg is None:
                seg = self._create_segment(seg_start)
            _pwrite_all(seg.fd, data, position - seg_start)
        except OSError as exc:
            self._roll_back(before, [seg_start] if created and seg_start in self._segments else [])
            raise StoreWriteError(f"commitlog write failed: {os.strerror(exc.errno or errno.EIO)}") from exc
        seg.length = position - seg_start + len(data)
        self._dirty.add(seg_start)
        self._end = position + len(data)

    def _roll_back(self, before: dict[int, int], created: list[int]) -> None:
        for start in created:
            seg = self._segments.pop(start)
            self._order.remove(start)
            seg.unmap()
            os.close(seg.fd)
            try:
                seg.path.unlink()
            except OSError as exc:  # the log still refuses to expose it: it is beyond _end
                log.error("could not remove segment path=%s error=%s", seg.path, exc)
        for start, length in before.items():
            seg = self._segments[start]
            seg.unmap()
            try:
                os.ftruncate(seg.fd, length)
            except OSError as exc:
                log.error("could not cut back segment path=%s length=%d error=%s", seg.path, length, exc)
            seg.length = length

    def flush(self) -> int:
        """Make everything written so far durable (fdatasync); return the durable position.

        Safe to call from a worker thread while the event loop appends.
        """
        with self._flush_lock:
            end = self._end
            dirty, self._dirty = self._dirty, set()
            try:
                for start in sorted(dirty):
                    seg = self._segments.get(start)
                    if seg is not None:
                        os.fdatasync(seg.fd)
            except OSError as exc:
                self._dirty |= dirty
                raise StoreWriteError(f"commitlog flush failed: {os.strerror(exc.errno or errno.EIO)}") from exc
            self._flushed = max(self._flushed, end)
            return self._flushed

    def sync_targets(self) -> tuple[int, list[int]]:
        """(end, fds) for a flush by a thread that cannot take the GIL (store/write/durable.py): an
        fdatasync of each of ``fds``, the files holding [durable position, end), makes all
        written so far durable; then ``flushed_to(end)``. (No lock, and the dirty set is left to
        ``flush``: both are correct whichever runs first.)"""
        end = self._end
        size = self.segment_size
        segments = self._segments
        starts = range(self._flushed - self._flushed % size, end, size)
        return end, [segments[s].fd for s in starts if s in segments]

    def flushed_to(self, end: int) -> None:
        """``sync_targets``'s fdatasyncs are done: everything before ``end`` is durable."""
        if end > self._flushed:
            self._flushed = min(end, self._end)  # (never past a truncation meanwhile)

    # -- reading -----------------------------------------------------------------------
    def records(self, spans: Sequence[tuple[int, int]]) -> list[bytes]:
        """The records at (position, size) ``spans``, as stored; back-to-back ones in one read
        (a store node sends records on to its gateway nodes as they are)."""
        records: list[bytes] = []
        i = 0
        while i < len(spans):
            start = end = spans[i][0]
            j = i
            while j < len(spans) and spans[j][0] == end:
                end += spans[j][1]
                j += 1
            buf = self.read(start, end - start)
            at = 0
            for _, size in spans[i:j]:
                records.append(buf[at:at + size])
                at += size
            i = j
        return records

    def read(self, position: int, size: int) -> bytes:
        """Read ``size`` bytes at ``position``; short or empty at the end of a segment.

        Reads slice a read-only map of the segment (a consumer of many queues reads records
        scattered over the log: one syscall each was half of its time). Bytes past the map
        (the active segment's newest) are read with ``pread`` until ``widen_map`` says to map
        again: re-mapping per read of new data cost an mmap and munmap of up to a segment per
        read on the event loop's thread.
        """
        seg = self._segments.get(position - position % self.segment_size)
        if seg is None:
            return b""
        offset = position - seg.start
        end = min(offset + size, seg.length)
        if offset >= end:
            return b""
        if end <= seg.mapped:
            assert seg.view is not None  # (mapped > 0 only while the view is open)
            return seg.view[offset:end]
        if widen_map(seg.mapped, seg.length, end - offset, seg.start < self._order[-1]):
            view = mmap.mmap(seg.fd, seg.length, access=mmap.ACCESS_READ)
            seg.unmap()
            seg.view, seg.mapped = view, seg.length
            return view[offset:end]
        return os.pread(seg.fd, end - offset, offset)

    # -- cutting -----------------------------------------------------------------------
    def truncate(self, position: int) -> int:
        """Drop every byte at or after ``position`` (recovery, repair); return how many were dropped."""
        keep_start = position - position % self.segment_size
        dropped = 0
        for start in [s for s in self._order if s > keep_start]:
            dropped += self._segments[start].length
            self._remove(start)
        seg = self._segments.get(keep_start) or self._create_segment(keep_start)
        keep = position - keep_start
        if seg.length > keep:
            dropped += seg.length - keep
            seg.unmap()
            os.ftruncate(seg.fd, keep)
            os.fsync(seg.fd)
            seg.length = keep
        self._end = position
        self._flushed = min(self._flushed, position)
        fsync_dir(self.directory)
        return dropped

    def delete_segment(self, start: int) -> int:
        """Delete a whole old segment (retention); the active segment is never deleted."""
        if start == self._order[-1]:
            raise ValueError("the active segment cannot be deleted")
        size = self._segments[start].length
        self._remove(start)
        return size

    def _remove(self, start: int) -> None:
        seg = self._segments.pop(start)
        self._order.remove(start)
        seg.unmap()
        os.close(seg.fd)
        seg.path.unlink(missing_ok=True)

    def close(self) -> None:
        for seg in self._segments.values():
            seg.unmap()
            os.close(seg.fd)
        self._segments.clear()
        self._order.clear()


def widen_map(mapped: int, length: int, read_size: int, sealed: bool) -> bool:
    """Whether a read past a segment's read map (``mapped`` of its ``length`` bytes) should map
    the segment again rather than ``pread``: a sealed segment no longer grows, so one map serves
    it for good; an active one once MAP_STEP bytes lie past its map, or for a read so large that
    copying it would cost more than mapping."""
    return sealed or length - mapped >= MAP_STEP or read_size >= MAP_STEP


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]
        offset += n


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (files created, renamed, removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fixed_segment_size(directory: Path, wanted: int) -> int:
    """The segment size is fixed when the log is created; later configuration cannot change it."""
    path = directory / LAYOUT_FILE
    try:
        stored = int(path.read_text().strip())
    except FileNotFoundError:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{wanted}\n")
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        tmp.replace(path)
        fsync_dir(directory)
        return wanted
    except ValueError:
        raise StoreError(f"{path} is damaged: it must hold the segment size in bytes") from None
    if stored != wanted:
        log.warning(
            "segment size is fixed at creation; ignoring the configured one configured=%d in_use=%d",
            wanted, stored,
        )
    return stored
