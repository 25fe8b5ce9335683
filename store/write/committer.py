"""The store's writer: every put waiting when it wakes is encoded, appended to the commitlog in
one write, indexed in one RocksDB WriteBatch and announced (notify, tail readers) at once, and what
the announcement woke runs before the committer's turn ends (notify.after_commit); its
acknowledgement follows per the flush mode: at once in ``async`` mode, after an fdatasync that
began after the write in ``sync`` mode (write/durable.py: group commit, as RocketMQ's
GroupCommitService, with delivery from the page cache meanwhile, as RabbitMQ). Futures resolve
in submission order. A lone message that finds the committer idle is committed in its caller's
turn (``submit``'s ``at_once``): no group could form around it, and waiting for the committer's
turn only delays its deliveries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from collections.abc import Callable, Hashable, Sequence


from .batching import Placed, PreparedMessage, dispatch_items, place, put_results
from ..log.commitlog import CommitLog
from ..index.consumequeue import ConsumeQueueIndex
from ..index.dispatcher import Dispatcher
from ..index.notify import NotifyHub
from .durable import SyncFlusher
from .idempotence import ProducerMarks
from .replicated import ReplicatedRelease
from ..clock import now_ms
from ..errors import InvalidMessageError, MessageTooLargeError, StoreClosedError, StoreError, StoreWriteError
from ..log_limit import RateLimitedLog
from ..messages import Message, PutResult
from ..meta.journal import MetaBatch
from ..stats import LatencyHistogram
from ..read.tail import TailHandoff

log = logging.getLogger("tidemq.store")

Batch = list[tuple[list[PreparedMessage], asyncio.Future[Sequence[PutResult]]]]


class GroupCommitter:
    """Run ``run()`` as one task; ``submit`` from the event loop; ``close()`` lets it finish
    what was submitted and return."""

    def __init__(self, commitlog: CommitLog, index: ConsumeQueueIndex, dispatcher: Dispatcher, *, sync: bool,
                 id_prefix: str, log_limited: RateLimitedLog, tail: TailHandoff, notify: NotifyHub) -> None:
        self.commitlog = commitlog
        self.index = index
        self.dispatcher = dispatcher
        self.notify = notify  # the dispatcher's: its listeners' after_commit callbacks end each batch
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
        # (a batch's fdatasync is asked for once its commit is complete, after its deliveries)
        self._flusher = SyncFlusher(commitlog, self._acknowledge, notify.after_commit) if sync else None
        self.not_leader: StoreError | None = None  # set while the store follows a leader (store/replica/)
        self.on_write: Callable[[], None] | None = None  # told after each write and flush (replication)
        # sync replication: batches published and acknowledged once confirmed (write/replicated.py)
        self.replicated: ReplicatedRelease | None = None
        self.unavailable: StoreError | None = None  # why writes are refused meanwhile (too few in sync)
        self._placing: dict[str, int] = {}  # queues' heads after batches written and not yet published
        self.marks = ProducerMarks()  # numbered puts (write/idempotence.py)
        self.apply_marks: Callable[[MetaBatch], None] | None = None  # their marks into the meta database
        self._committing = False  # a commit runs (and its after-commit callbacks): puts wait for the task
        self._turn_committed = False  # a commit ran in this loop turn (cleared by the next turn)

    def close(self) -> None:
        self.closing = True
        self._wakeup.set()

    def submit(self, prepared: list[PreparedMessage], *, at_once: bool = False) -> asyncio.Future[Sequence[PutResult]]:
        """Queue ``prepared`` for the committer's next turn; with ``at_once``, a put of one message
        that finds the committer idle (nothing waiting, no commit running or run in this loop
        turn, no replication) is committed now, before this returns, and answered as any. Under
        load the committer commits at the start of every turn, so the turn's reads still wait
        for the next one and commit together."""
        if self.closing:
            raise StoreClosedError("the store is closing")
        failure = self.failure()
        if failure is not None:
            raise failure
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Sequence[PutResult]] = loop.create_future()
        now = time.perf_counter()
        self.backlog += len(prepared)
        if (at_once and len(prepared) == 1 and not self._pending and not self._committing
                and not self._turn_committed and self.replicated is None and self.on_write is None):
            self._commit_batch([(prepared, fut)], [now], loop)
            return fut
        self._pending.append((prepared, fut))
        self._pending_since.append(now)
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
        if self.unavailable is not None:
            return self.unavailable
        if self._write_failure is not None:
            return StoreWriteError(f"the store refuses writes after an index failure: {self._write_failure}")
        return self._flusher.failed if self._flusher is not None else None

    async def run(self) -> None:
        flusher = self._flusher
        loop = asyncio.get_running_loop()
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
                self._commit_batch(batch, since, loop)
            if flusher is not None:  # closing: what was written is acknowledged before the end
                await flusher.drained()
            if self.replicated is not None:  # closing: what no replica confirmed is not acknowledged
                self.replicated.abandon(StoreClosedError("the store closed before the in-sync replicas confirmed it"))
        finally:
            if flusher is not None:
                flusher.stop()

    def _commit_batch(self, batch: Batch, since: list[float], loop: asyncio.AbstractEventLoop) -> None:
        """One commit, in the committer's turn or its caller's: the deliveries it woke run at its
        end, before what it scheduled; puts made meanwhile (by those callbacks) wait for the task."""
        self._committing = True
        self.notify.commit_begins()
        try:
            self._commit_and_answer(batch, since)
        finally:
            try:
                self.notify.commit_ends()  # (the deliveries it woke: before what it scheduled)
            finally:
                self._committing = False
                if not self._turn_committed:
                    self._turn_committed = True
                    loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_committed = False

    def _commit_and_answer(self, batch: Batch, since: list[float]) -> None:
        """Commit ``batch`` and answer its puts: at once (``async``), once durable (``sync``:
        the flusher), or once the in-sync replicas hold it (sync replication)."""
        flusher = self._flusher
        end: int | None = None
        try:
            failure = self.failure()
            if failure is not None:  # (submitted before the failure)
                raise failure
            outcome: list[Sequence[PutResult]] | Written | BaseException = self._commit(batch)
            end = self.commitlog.end_position
        except Exception as exc:  # never let one bad batch stop the committer
            if self.marks.numbered:
                self.marks.forget([fut for _, fut in batch])
            if isinstance(exc, StoreWriteError):  # the disk refused (full, I/O error): says why, no traceback
                self._log_limited.log(logging.ERROR, str(exc), "commit failed")
            else:
                self._log_limited.log(logging.ERROR, type(exc).__name__, "commit failed", exc_info=True)
            outcome = exc if isinstance(exc, StoreError) else StoreWriteError(str(exc))
        if self.on_write is not None and end is not None:
            self.on_write()
        if isinstance(outcome, Written):
            assert self.replicated is not None
            self.replicated.wait(end, (batch, outcome, since))
            if flusher is not None:
                flusher.wait(end, None)  # (the leader's own durability: part of what it confirms)
            return
        if self.replicated is not None:  # (a failed batch: answered in its turn)
            self.replicated.wait(None, (batch, outcome, since))
        elif flusher is not None:
            flusher.wait(end, (batch, outcome, since))
        else:
            self._acknowledge((batch, outcome, since), None)

    def _acknowledge(self, entry: tuple[Batch, list[Sequence[PutResult]] | BaseException, list[float]],
                     failure: StoreError | None) -> None:
        """Resolve a batch's futures: with their results, or the batch's or the flusher's failure."""
        if self.on_write is not None and self._flusher is not None:
            self.on_write()  # (the flush moved the durable position)
        if entry is None:  # (a flush asked for by a replicated batch, answered by ``release``)
            return
        batch, outcome, since = entry
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

    def _commit(self, batch: Batch) -> list[Sequence[PutResult]] | Written:
        """Write, index and announce ``batch``; what each of its puts returns. Under sync
        replication, write only: ``release`` publishes it once confirmed."""
        store_ts = now_ms()
        groups = [prepared for prepared, _ in batch]
        if self.replicated is None:
            records, placed, assigned = place(groups, self.index.cache.get, self.index.resolve, store_ts)
        else:
            placing, cached = self._placing, self.index.cache.get
            records, placed, assigned = place(groups, lambda name: placing.get(name) or cached(name),
                                              self.index.resolve, store_ts)
        positions = self.commitlog.append(records)  # StoreWriteError: nothing was written
        if self.marks.numbered:
            self._mark(batch, groups, positions, records, store_ts)
        if self.replicated is not None:
            self._placing.update(assigned)
            return Written(groups, records, placed, assigned, positions, self.commitlog.end_position, store_ts)
        return self._publish(groups, records, placed, assigned, positions, self.commitlog.end_position, store_ts)

    def _mark(self, batch: Batch, groups: list[list[PreparedMessage]], positions: list[int], records: list[bytes],
              store_ts: int) -> None:
        """The numbered puts' marks, right after their records (write/idempotence.py)."""
        marks = self.marks.marks([fut for _, fut in batch], groups, positions, records, store_ts)
        if marks is None or self.apply_marks is None:
            return
        try:
            self.apply_marks(marks)
        except StoreError as exc:  # (the puts stand; sent again, they would be written again)
            self._log_limited.log(logging.ERROR, "marks", "idempotent puts not marked error=%s", exc)

    def release(self, entry: tuple[Batch, Written | BaseException, list[float]] | _Tail, error: StoreError | None,
                answered: bool) -> None:
        """ReplicatedRelease's answer for a written batch: publish it and acknowledge its puts
        (``answered``: they were answered already, publish only), or answer them with ``error``."""
        if isinstance(entry, _Tail):
            if error is None:  # (abandoned: the next leader keeps or cuts it)
                try:
                    entry.publish()
                except Exception as exc:
                    raise self.refuse_writes(exc) from exc
                finally:
                    for name, packed in entry.heads.items():
                        if self._placing.get(name) == packed:
                            del self._placing[name]
            return
        batch, written, since = entry
        if not isinstance(written, Written):  # a batch that failed to write, answered in its turn
            self._acknowledge((batch, written, since), None)
            return
        if error is not None:
            self._acknowledge((batch, error, since), None)
            return
        try:
            results: list[Sequence[PutResult]] | BaseException = self._publish(
                written.groups, written.records, written.placed, written.assigned, written.positions, written.end,
                written.store_ts)
        except StoreError as exc:
            results = exc
        finally:
            for name, packed in written.assigned.items():
                if self._placing.get(name) == packed:
                    del self._placing[name]
        if not answered:
            self._acknowledge((batch, results, since), None)

    def make_durable(self, end: int) -> None:
        """Bytes written around the committer (a meta change record, store.py) must become durable
        too: in ``sync`` flush mode ask the flusher for an fdatasync covering ``end``, as for a
        batch (a replicated leader counts only what it has made durable)."""
        if self._flusher is not None:
            self._flusher.wait(end, None)

    def adopt_tail(self, end: int, heads: dict[str, int], publish: Callable[[], None]) -> None:
        """A promoted follower's unpublished records, up to ``end``: new writes are placed after
        them (``heads``: each queue's packed state after them), and ``publish`` indexes them --
        under sync replication once confirmed, before any later batch; at once otherwise."""
        if self.replicated is None:
            publish()
            return
        self._placing.update(heads)
        self.replicated.wait(end, _Tail(publish, heads))

    def forget_unpublished(self) -> None:
        """Leadership was lost: the written batches no one confirmed are the new leader's to keep
        or cut; placement starts again from what was published."""
        self._placing.clear()

    def _publish(self, groups: list[list[PreparedMessage]], records: list[bytes], placed: list[Placed],
                 assigned: dict[str, int], positions: list[int], end: int, store_ts: int) -> list[Sequence[PutResult]]:
        """Index (the checkpoint to ``end``, where the records end) and announce written records;
        what each put returns."""
        try:
            items = dispatch_items(positions, placed, store_ts)
            self.dispatcher.dispatch(items, end, assigned)
        except Exception as exc:
            raise self.refuse_writes(exc) from exc
        if self.tail.readers:
            # The messages are committed whatever happens here.
            try:
                self.tail.hand(items, records, placed, store_ts, assigned)
            except Exception:
                self._log_limited.log(logging.ERROR, "tail", "hand-off to tail readers failed", exc_info=True)
        return put_results(groups, positions, placed, self._id_prefix, store_ts)


@dataclass(slots=True)
class _Tail:
    """A promoted follower's unpublished records, waiting for confirmation (``adopt_tail``)."""
    publish: Callable[[], None]
    heads: dict[str, int]


@dataclass(slots=True)
class Written:
    """A batch in the commitlog and not yet published (sync replication): what ``_publish``
    needs once the in-sync replicas confirm it."""
    groups: list[list[PreparedMessage]]
    records: list[bytes]
    placed: list[Placed]
    assigned: dict[str, int]
    positions: list[int]
    end: int
    store_ts: int


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

