"""Sync-mode durability: the commitlog's fdatasync on a thread of its own, and the committed
batches' acknowledgements after it, in the order they were submitted.

The committer writes, indexes and announces a batch at once, so a consumer can read it from the
page cache (which a killed process leaves intact) while the fdatasync runs, as RabbitMQ
delivers a persistent message before the fsync that precedes its confirm. What waits for the
disk is the acknowledgement only: a batch's futures resolve once an fdatasync that began after
its write has returned. One fdatasync covers every batch written before it began (group
commit); batches written while it runs wait for the next one, which starts when it returns.

The thread's loop (write/fsync_loop.py, compiled) never takes the GIL: the event loop names the files
to fdatasync and wakes it through an eventfd, and learns of the answer from another eventfd
(one reader callback, no future chain across threads, no GIL hand-off). A batch's fdatasync is
asked for once its commit is complete (``soon``: the committer's notify.after_commit), behind
the deliveries it woke: the woken thread competes for the CPU with them on a busy machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from ..log.commitlog import CommitLog
from ..errors import StoreError, StoreWriteError
from .fsync_loop import MAX_FILES, FsyncLoop

log = logging.getLogger("tidemq.store")

# (the commitlog's end after a batch, or None for a batch that failed, the committer's entry):
# an acknowledgement waiting for the disk.
Waiting = tuple[int | None, Any]
# (the committer's entry, the failure that overrides its outcome or None): on the loop, in order.
Acknowledge = Callable[[Any, "StoreError | None"], None]


class SyncFlusher:
    """``start()`` on the event loop; ``wait()`` hands it a written batch's acknowledgement;
    ``drained()`` resolves when none is left; ``stop()`` ends the thread.

    ``failed`` is set once an fdatasync failed: the records it was to cover are indexed and
    may have been delivered, so they can be neither cut back nor followed by more (a later
    crash would leave a hole in the middle of the log); the committer refuses writes."""

    def __init__(self, commitlog: CommitLog, acknowledge: Acknowledge,
                 soon: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._commitlog = commitlog
        self._acknowledge = acknowledge
        self._soon = soon  # runs the request once the commit is complete (default: the loop's next turn)
        self._waiting: deque[Waiting] = deque()
        self._requested = False  # an fdatasync was asked for and has not come back yet
        self._request_due = False  # an fdatasync is to be asked for (``soon``)
        self._asked_end = 0  # the commitlog position the asked fdatasync makes durable
        self.failed: StoreError | None = None
        self._ask = os.eventfd(0, os.EFD_CLOEXEC)  # loop -> thread (blocking reads)
        self._done = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # thread -> loop
        self._fsync = FsyncLoop(self._ask, self._done)
        self._stopping = False
        self._drained: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._fsync.run, name="store-flusher", daemon=True)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        self._drained.set()
        self._loop.add_reader(self._done, self._on_done)
        self._thread.start()

    def wait(self, end: int | None, entry: Any) -> None:
        """Acknowledge ``entry`` once the commitlog is durable up to ``end`` (a failed batch,
        ``end`` None, only waits for the batches before it, to keep the order)."""
        if not self._waiting and end is None:
            self._acknowledge(entry, None)
            return
        self._waiting.append((end, entry))
        assert self._drained is not None
        self._drained.clear()
        if not self._requested and end is not None and not self._request_due:
            assert self._loop is not None
            self._request_due = True
            (self._soon or self._loop.call_soon)(self._request_now)

    async def drained(self) -> None:
        assert self._drained is not None
        await self._drained.wait()

    def stop(self) -> None:
        if self._loop is not None and not self._stopping:
            self._stopping = True
            self._loop.remove_reader(self._done)
            self._fsync.stop()
            self._thread.join()
        for fd in (self._ask, self._done):
            os.close(fd)
        self._ask = self._done = -1

    def _request_now(self) -> None:
        self._request_due = False
        if not self._requested and not self._stopping and self._ask >= 0:  # (not stopped meanwhile)
            self._request()

    def _request(self) -> None:
        end, fds = self._commitlog.sync_targets()
        while len(fds) > MAX_FILES:  # (tiny segments only) the oldest here, the rest on the thread
            try:
                os.fdatasync(fds.pop(0))
            except OSError as exc:
                self.failed = StoreWriteError(f"the store refuses writes after a failed fdatasync: {exc}")
        self._requested = True
        self._asked_end = end
        self._fsync.request(fds)

    def _on_done(self) -> None:  # the loop, when an fdatasync came back
        try:
            os.eventfd_read(self._done)
        except BlockingIOError:
            return
        self._requested = False
        error = self._fsync.error
        if error and self.failed is None:
            self.failed = StoreWriteError(f"the store refuses writes after a failed fdatasync: {os.strerror(error)}")
            log.error("commitlog flush failed; refusing writes until restart error=%s", os.strerror(error))
        if self.failed is None:
            self._commitlog.flushed_to(self._asked_end)
        durable = self._commitlog.flushed_position
        waiting = self._waiting
        failed = self.failed
        while waiting:
            end, entry = waiting[0]
            if end is not None and end > durable and failed is None:
                break
            waiting.popleft()
            self._acknowledge(entry, failed if end is not None else None)
        if waiting:
            self._request()
        else:
            assert self._drained is not None
            self._drained.set()
