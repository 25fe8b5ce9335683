"""Seeding a replica whose log cannot be streamed to (new, wiped, or behind what the leader's
retention kept): the leader's index and meta databases as RocksDB checkpoints, its commitlog
segments from its oldest position, and its epoch history, copied while it keeps serving.

``snapshot`` takes them on the leader in one step of the event loop -- the index checkpoint
first, then meta, then the log's end -- so that recovery on the replica (re-indexing the log
from the index's checkpoint and applying its meta change records again, in order) ends in the
leader's state at that end. ``SeedWriter`` collects the files on the replica in ``.seed/`` of its
data directory and marks them complete; ``install_seed``, run when the store opens, puts them in
place of the old files (a crash in between: the next open does it again).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from rocksdict import Checkpoint, Rdict

from ..errors import StoreError
from ..log.commitlog import CommitLog, fsync_dir
from .epochs import FILE_NAME as EPOCHS_FILE

SEED_DIR = ".seed"
SNAPSHOT_DIR = ".snapshots"
COMPLETE = "SEED_COMPLETE"
PARTS = ("commitlog", "index", "meta", EPOCHS_FILE)


@dataclass(slots=True)
class Snapshot:
    directory: Path  # the checkpoints (hard links), removed by ``discard``
    files: list[tuple[str, Path, int]]  # (name in the seed, where it is now, bytes to send)
    end: int  # the commitlog position the seed reaches

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def snapshot(data_dir: Path, index: Rdict, meta: Rdict, commitlog: CommitLog) -> Snapshot:
    """The leader's files for a seed, taken now (see the module's docstring for the order)."""
    directory = data_dir / SNAPSHOT_DIR / uuid.uuid4().hex
    directory.mkdir(parents=True)
    try:
        Checkpoint(index).create_checkpoint(str(directory / "index"))
        Checkpoint(meta).create_checkpoint(str(directory / "meta"))
    except Exception as exc:  # (rocksdict raises a plain Exception: a full disk)
        shutil.rmtree(directory, ignore_errors=True)
        raise StoreError(f"could not take a snapshot to seed a replica: {exc}") from None
    end = commitlog.end_position
    files: list[tuple[str, Path, int]] = []
    for part in ("index", "meta"):
        for path in sorted((directory / part).iterdir()):
            files.append((f"{part}/{path.name}", path, path.stat().st_size))
    for seg in commitlog.segments():
        if seg.start < end:
            files.append((f"commitlog/{seg.path.name}", seg.path, min(seg.length, end - seg.start)))
    layout = commitlog.directory / "SEGMENT_SIZE"
    files.append(("commitlog/SEGMENT_SIZE", layout, layout.stat().st_size))
    epochs, copy = data_dir / EPOCHS_FILE, directory / EPOCHS_FILE
    if epochs.exists():
        shutil.copyfile(epochs, copy)  # (it is replaced, not appended to: a copy of it now)
    else:
        copy.write_text("")
    files.append((EPOCHS_FILE, copy, copy.stat().st_size))
    return Snapshot(directory, files, end)


class SeedWriter:
    """A replica's side: files written as they arrive, then marked complete."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / SEED_DIR
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self.bytes = 0

    def write(self, name: str, offset: int, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if offset else "wb") as fh:
            fh.seek(offset)
            fh.write(data)
        self.bytes += len(data)

    def complete(self, end: int) -> None:
        """Every file is here: fsync them, then the marker that lets ``install_seed`` use them."""
        for path in self.root.rglob("*"):
            if path.is_file():
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(self.root)
        (self.root / COMPLETE).write_text(f"{end}\n")
        fsync_dir(self.root)

    def _path(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if self.root.resolve() not in path.parents or name.split("/")[0] not in PARTS:
            raise StoreError(f"a seed file outside the store's parts: {name!r}")
        return path


def install_seed(data_dir: Path) -> bool:
    """Put a complete seed in place of the store's files (before they are opened); whether one was."""
    seed = data_dir / SEED_DIR
    if not (seed / COMPLETE).exists():
        shutil.rmtree(seed, ignore_errors=True)  # (an unfinished one: it starts again)
        return False
    for part in PARTS:  # (a part already moved is not in the seed any more: a crash here is redone)
        if not (seed / part).exists():
            continue
        old = data_dir / part
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
        (seed / part).rename(old)
        fsync_dir(data_dir)
    shutil.rmtree(seed)
    return True
