"""The epoch history of a replica's commitlog: which leader epoch wrote which bytes.

Each entry is (epoch, start position): from ``start`` on, up to the next entry's start, the log's
bytes were written by the leader of ``epoch``. Two replicas hold the same bytes up to the end of
the last epoch they share (Kafka's leader epochs, RocketMQ's EpochFileCache); ``common_end``
says where, so a rejoining replica cuts its log there and streams from there. The file is
replaced atomically (written aside, fsynced, renamed, directory fsynced).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StoreError
from ..log.commitlog import fsync_dir

FILE_NAME = "EPOCHS"

Epochs = list[tuple[int, int]]  # [(epoch, start position)]: epochs increase, starts never go back


class EpochHistory:
    """The epoch file of one data directory, loaded at open and kept in memory."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / FILE_NAME
        self.entries: Epochs = _load(self._path)

    @property
    def current(self) -> int:
        """The newest epoch this log holds bytes (or a start) of; 0 for a log never replicated."""
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """Bytes from ``start`` on are written by the leader of ``epoch`` (a newer one)."""
        if self.entries:
            last_epoch, last_start = self.entries[-1]
            if epoch <= last_epoch:
                raise StoreError(f"epoch {epoch} does not follow epoch {last_epoch}")
            if start < last_start:
                raise StoreError(f"epoch {epoch} starts at {start}, before epoch {last_epoch} at {last_start}")
        self._save([*self.entries, (epoch, start)])

    def cut(self, end: int, adopt: Epochs | None = None) -> None:
        """The log is cut at ``end``: entries starting after it go; then ``adopt`` (the leader's
        entries for bytes at or after ``end``, which this replica will receive) is added."""
        kept = [(e, s) for e, s in self.entries if s <= end]
        if kept and kept[-1][1] == end:  # an epoch that starts where the log now ends holds nothing
            kept.pop()
        last = kept[-1][0] if kept else 0
        self._save(kept + [(e, s) for e, s in adopt or () if e > last and s >= end])

    def _save(self, entries: Epochs) -> None:
        _check(entries, self._path)
        tmp = self._path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            fh.writelines(f"{epoch} {start}\n" for epoch, start in entries)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self._path)
        fsync_dir(self._path.parent)
        self.entries = entries


def common_end(mine: Epochs, my_end: int, theirs: Epochs, their_end: int) -> int:
    """Where two logs stop holding the same bytes: the end of the newest epoch both have (the
    earlier of the two ends of that epoch); 0 when they share none."""
    shared = {e for e, _ in mine} & {e for e, _ in theirs}
    if not shared:
        return 0
    epoch = max(shared)
    return min(_end_of(mine, epoch, my_end), _end_of(theirs, epoch, their_end))


def _end_of(entries: Epochs, epoch: int, log_end: int) -> int:
    for i, (e, _) in enumerate(entries):
        if e == epoch:
            return min(entries[i + 1][1], log_end) if i + 1 < len(entries) else log_end
    raise KeyError(epoch)


def _load(path: Path) -> Epochs:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    try:
        entries = [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line.strip())]
    except ValueError:
        raise StoreError(f"{path} is damaged: each line must be 'epoch start-position'") from None
    _check(entries, path)
    return entries


def _check(entries: Epochs, path: Path) -> None:
    for (e1, s1), (e2, s2) in zip(entries, entries[1:]):
        if e2 <= e1 or s2 < s1:
            raise StoreError(f"{path}: epochs must increase and their starts must not go back: {entries}")
    if any(e < 1 or s < 0 for e, s in entries):
        raise StoreError(f"{path}: epochs start at 1 and positions at 0: {entries}")
