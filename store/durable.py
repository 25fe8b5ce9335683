"""Sync-mode durability: the commitlog's fdatasync on a thread of its own, and the committed
batches' acknowledgements after it, in the order they were submitted.

The committer writes, indexes and announces a batch at once, so a consumer can read it from the
page cache (which a killed process leaves intact) while the fdatasync runs, as RabbitMQ
delivers a persistent message before the fsync that precedes its confirm. What waits for the
disk is the acknowledgement only: a batch's futures resolve once an fdatasync that began after
its write has returned. One fdatasync covers every batch written before it began (group
commit); batches written while it runs wait for the next one, which starts when it returns.

The thread blocks on an eventfd, not on a Python lock or an executor queue: it takes the GIL
only for the few bytecodes between its three system calls, and the event loop learns of a
finished fdatasync from a readable eventfd (one callback, no future chain across threads).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .commitlog import CommitLog
from .errors import StoreError, StoreWriteError

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

    def __init__(self, commitlog: CommitLog, acknowledge: Acknowledge) -> None:
        self._commitlog = commitlog
        self._acknowledge = acknowledge
        self._waiting: deque[Waiting] = deque()
        self._requested = False  # an fdatasync was asked for and has not come back yet
        self._error: StoreWriteError | None = None  # the last fdatasync's, set by the thread
        self.failed: StoreError | None = None
        self._ask = os.eventfd(0, os.EFD_CLOEXEC)  # loop -> thread (blocking reads)
        self._done = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # thread -> loop
        self._stopping = False
        self._drained: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="store-flusher", daemon=True)

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
        if not self._requested and end is not None:
            self._request()

    async def drained(self) -> None:
        assert self._drained is not None
        await self._drained.wait()

    def stop(self) -> None:
        if self._loop is not None and not self._stopping:
            self._stopping = True
            self._loop.remove_reader(self._done)
            os.eventfd_write(self._ask, 1)
            self._thread.join()
        for fd in (self._ask, self._done):
            os.close(fd)
        self._ask = self._done = -1

    def _request(self) -> None:
        self._requested = True
        os.eventfd_write(self._ask, 1)

    def _run(self) -> None:  # the thread
        commitlog = self._commitlog
        while True:
            os.eventfd_read(self._ask)  # (requests that came meanwhile coalesce into one)
            if self._stopping:
                return
            try:
                commitlog.flush()
                self._error = None
            except StoreWriteError as exc:
                self._error = exc
            except Exception as exc:  # noqa: BLE001 - reported to the loop, never lost in the thread
                self._error = StoreWriteError(f"commitlog flush failed: {exc}")
            os.eventfd_write(self._done, 1)

    def _on_done(self) -> None:  # the loop, when an fdatasync came back
        try:
            os.eventfd_read(self._done)
        except BlockingIOError:
            return
        self._requested = False
        if self._error is not None and self.failed is None:
            self.failed = StoreWriteError(f"the store refuses writes after a failed fdatasync: {self._error}")
            log.error("commitlog flush failed; refusing writes until restart error=%s", self._error)
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
