"""The store's writer: every put waiting when it wakes is encoded, appended to the commitlog in
one write, indexed in one RocksDB WriteBatch and announced (notify, tail readers) at once; its
acknowledgement follows per the flush mode: at once in ``async`` mode, after an fdatasync that
began after the write in ``sync`` mode (write/durable.py: group commit, as RocketMQ's
GroupCommitService, with delivery from the page cache meanwhile, as RabbitMQ). Futures resolve
in submission order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Sequence


from .batching import PreparedMessage, dispatch_items, place, put_results
from ..log.commitlog import CommitLog
from ..index.consumequeue import ConsumeQueueIndex
from ..index.dispatcher import Dispatcher
from .durable import SyncFlusher
from ..clock import now_ms
from ..errors import InvalidMessageError, MessageTooLargeError, StoreClosedError, StoreError, StoreWriteError
from ..log_limit import RateLimitedLog
from ..messages import Message, PutResult
from ..stats import LatencyHistogram
from ..read.tail import TailHandoff

log = logging.getLogger("tidemq.store")

Batch = list[tuple[list[PreparedMessage], asyncio.Future[Sequence[PutResult]]]]


class GroupCommitter:
    """Run ``run()`` as one task; ``submit`` from the event loop; ``close()`` lets it finish
    what was submitted and return."""

    def __init__(self, commitlog: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher, *, sync: bool,
                 id_prefix: str, log_limited: RateLimitedLog, tail: TailHandoff) -> None:
        self.commitlog = commitlog
        self.index = index
        self.dispatcher = dispatcher
        self.sync = sync  # acknowledge after fdatasync (flush mode "sync")
        self._id_prefix = id_prefix
        self._log_limited = log_limited  # failures that repeat with every commit (a full disk)
        self.tail = tail  # readers at queues' ends, handed each commit's messages (read/tail.py)
        self._pending: Batch = []
        self._pending_since: list[float] = []  # perf_counter() of each entry of _pending
        self.backlog = 0  # messages submitted and not yet durable (or failed)
        self.put_latency = LatencyHistogram()  # submit -> durable (or failed), per put call
        self._wakeup = asyncio.Event()
        self.closing = False
        self._write_failure: StoreError | None = None
        self._flusher = SyncFlusher(commitlog, self._acknowledge) if sync else None
        self.not_leader: StoreError | None = None  # set while the store follows a leader (store/replica/)
        self.on_write: Callable[[], None] | None = None  # told after each write and flush (replication)

    def close(self) -> None:
        self.closing = True
        self._wakeup.set()

    def submit(self, prepared: list[PreparedMessage]) -> asyncio.Future[Sequence[PutResult]]:
        if self.closing:
            raise StoreClosedError("the store is closing")
        failure = self.failure()
        if failure is not None:
            raise failure
        fut: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()
        self._pending.append((prepared, fut))
        self._pending_since.append(time.perf_counter())
        self.backlog += len(prepared)
        self._wakeup.set()
        return fut

    def refuse_writes(self, exc: BaseException) -> StoreWriteError:
        """Records are in the commitlog that the index lacks; a restart re-dispatches them. Until
        then the index cannot advance in order, so further writes are refused rather than reordered."""
        self._write_failure = StoreWriteError(f"index write failed: {exc}")
        log.error("index write failed; refusing writes until restart error=%s", exc)
        return self._write_failure

    def failure(self) -> StoreError | None:
        if self.not_leader is not None:
            return self.not_leader
        if self._write_failure is not None:
            return StoreWriteError(f"the store refuses writes after an index failure: {self._write_failure}")
        return self._flusher.failed if self._flusher is not None else None

    async def run(self) -> None:
        flusher = self._flusher
        if flusher is not None:
            flusher.start()
        try:
            while True:
                if not self._pending:
                    if self.closing:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                batch, self._pending = self._pending, []
                since, self._pending_since = self._pending_since, []
                end: int | None = None
                try:
                    failure = self.failure()
                    if failure is not None:  # (submitted before the failure)
                        raise failure
                    outcome: list[Sequence[PutResult]] | BaseException = self._commit(batch)
                    end = self.commitlog.end_position
                except Exception as exc:  # never let one bad batch stop the committer
                    if isinstance(exc, StoreWriteError):  # the disk refused (full, I/O error): says why, no traceback
                        self._log_limited.log(logging.ERROR, str(exc), "commit failed")
                    else:
                        self._log_limited.log(logging.ERROR, type(exc).__name__, "commit failed", exc_info=True)
                    outcome = exc if isinstance(exc, StoreError) else StoreWriteError(str(exc))
                entry = (batch, outcome, since)
                if self.on_write is not None and end is not None:
                    self.on_write()
                if flusher is not None:
                    flusher.wait(end, entry)
                else:
                    self._acknowledge(entry, None)
            if flusher is not None:  # closing: what was written is acknowledged before the end
                await flusher.drained()
        finally:
            if flusher is not None:
                flusher.stop()

    def _acknowledge(self, entry: tuple[Batch, list[Sequence[PutResult]] | BaseException, list[float]],
                     failure: StoreError | None) -> None:
        """Resolve a batch's futures: with their results, or the batch's or the flusher's failure."""
        batch, outcome, since = entry
        if self.on_write is not None and self._flusher is not None:
            self.on_write()  # (the flush moved the durable position)
        if failure is not None:
            outcome = failure
        if isinstance(outcome, BaseException):
            _fail(batch, outcome)
        else:
            for (_, fut), results in zip(batch, outcome):
                if not fut.done():
                    fut.set_result(results)
        self.backlog -= sum(len(prepared) for prepared, _ in batch)
        now = time.perf_counter()
        observe = self.put_latency.observe
        for submitted in since:
            observe(now - submitted)

    def _commit(self, batch: Batch) -> list[Sequence[PutResult]]:
        """Write, index and announce ``batch``; what each of its puts returns."""
        store_ts = now_ms()
        groups = [prepared for prepared, _ in batch]
        records, placed, assigned = place(groups, self.index.cache.get, self.index.resolve, store_ts)
        positions = self.commitlog.append(records)  # StoreWriteError: nothing was written
        try:
            items = dispatch_items(positions, placed, store_ts)
            self.dispatcher.dispatch(items, self.commitlog.end_position, assigned)
        except Exception as exc:
            raise self.refuse_writes(exc) from exc
        if self.tail.readers:
            # The messages are committed whatever happens here.
            try:
                self.tail.hand(items, records, placed, store_ts, assigned)
            except Exception:
                self._log_limited.log(logging.ERROR, "tail", "hand-off to tail readers failed", exc_info=True)
        return put_results(groups, positions, placed, self._id_prefix, store_ts)


def prepare_each(items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None,
                  limit: int) -> tuple[list[PreparedMessage], dict[int, StoreError]]:
    """``put_each_nowait``'s messages one by one: those the store can take, and the refused."""
    prepared: list[PreparedMessage] = []
    refused: dict[int, StoreError] = {}
    stopped: dict[Hashable, StoreError] = {}
    for i, (message, queues) in enumerate(items):
        group = groups[i] if groups is not None else i
        if group in stopped:
            refused[i] = stopped[group]
            continue
        try:
            prepared.append(PreparedMessage(message, queues, limit))
        except (InvalidMessageError, MessageTooLargeError) as exc:
            refused[i] = stopped[group] = exc
    return prepared, refused

def _fail(batch: Batch, exc: BaseException) -> None:
    for _, fut in batch:
        if not fut.done():
            fut.set_exception(exc)

