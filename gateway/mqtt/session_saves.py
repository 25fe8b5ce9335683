"""When MQTT session state is written, and what waits for it: the write-ahead rule of the gateway.

A change a client relies on after a crash -- an outbound QoS 2 PUBLISH's packet id and offset, its
release (PUBREL), an inbound QoS 2 packet id held (PUBREC) or let go (PUBCOMP), a subscription
(SUBACK) -- marks its session dirty. Dirty sessions are written once per turn of the loop, all in
one write, and whatever their connections write meanwhile is held until that write is durable
(locally: when it returns; on a gateway node: when the store node answers). So no packet that
commits the client to a state leaves ahead of the state that makes its retransmission
recognisable after kill -9 (MQTT 5.0 section 4.3.3: the sender keeps the packet id until PUBCOMP,
the receiver that sent PUBREC must never deliver the message again). Read progress (cursor
offsets after QoS 0/1 deliveries and acks) is saved within ``progress_save_interval_s`` and
holds nothing back: QoS 1 is at least once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from store import StoreError
from store import RateLimitedLog

from ..ports import SessionRepository
from .session import Session

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class SessionSaves:
    """``sessions``: the node's sessions by client id; ``saved(client_id)``: called once a
    session's write is on its way (a gateway node then forgets an offline one)."""

    def __init__(self, repository: SessionRepository, sessions: Mapping[str, Session], progress_interval_s: float,
                 saved: Callable[[str], None]) -> None:
        self.repository = repository
        self.sessions = sessions
        self.progress_interval_s = progress_interval_s
        self._saved = saved
        self._dirty: set[str] = set()  # written at the end of this turn; their connections' output waits
        self._unheld: set[str] = set()  # written at the end of this turn; nothing waits for them
        self._flush_scheduled = False
        self._progressed: set[str] = set()  # read progress waiting for the interval
        self._progress_timer: asyncio.TimerHandle | None = None
        # writes are numbered; held output waits for the number that covers its session's state
        self._next = 1  # the number of the next write
        self._durable = 0  # every write up to this number is durable
        self._finished: set[int] = set()  # writes durable (or failed) ahead of an earlier one
        self._unanswered: dict[str, int] = {}  # client id -> its last write not durable yet (a store node's)
        self._held: dict[MQTTConnection, list[tuple[int, bytes]]] = {}  # in the order written
        self._failures = RateLimitedLog(log)  # a full disk fails every write until space is back
        # why the last write with sessions in it failed (None: it did not); persistent sessions'
        # SUBSCRIBEs are refused meanwhile (subscribe.py)
        self.failure: BaseException | None = None

    # -- what changed --------------------------------------------------------------------------
    def mark_dirty(self, session: Session, *, holds_output: bool = True) -> None:
        """Write the session at the end of this turn (once, however many changes); its
        connection's output waits for that write, unless the change commits the client to
        nothing (``holds_output`` False: a connect's bookkeeping; its failure closes nothing)."""
        if not session.persistent:
            return  # (nothing of it outlives its connection: no crash can lose it)
        (self._dirty if holds_output else self._unheld).add(session.client_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def mark_progress(self, session: Session) -> None:
        """Write the session's read progress within ``progress_interval_s``: one write per session
        per interval, not per turn (a fan-out to 1,000 persistent sessions would otherwise write
        each of them per batch). Like RocketMQ's consumer offsets: after a crash the client
        gets again what it read since the last save."""
        if not session.persistent:
            return
        self._progressed.add(session.client_id)
        if self._progress_timer is None:
            self._progress_timer = asyncio.get_running_loop().call_later(self.progress_interval_s,
                                                                         self._flush_progress)

    def _flush_progress(self) -> None:
        self._progress_timer = None
        self._dirty |= self._progressed
        self._progressed = set()
        self.flush()

    def hold_output(self, client_id: str, answered: Awaitable[None]) -> None:
        """What the connection of ``client_id`` writes from now on waits for ``answered``, a
        change other than its session's that its next packets rely on (a retained message a
        replicated store has yet to confirm); if that fails, the output is dropped and the
        connection closed, as for a session write that failed (the client retries)."""
        number = self._next
        self._next += 1
        self._unanswered[client_id] = number
        asyncio.ensure_future(answered).add_done_callback(
            lambda done: self._finish(number, not done.cancelled() and done.exception() is None))

    def forget(self, client_id: str) -> None:
        """The session ended (its stored state is deleted): nothing of it is written any more."""
        self._dirty.discard(client_id)
        self._unheld.discard(client_id)

    def stop(self) -> None:
        self._dirty.clear()
        self._unheld.clear()
        self._progressed.clear()
        if self._progress_timer is not None:
            self._progress_timer.cancel()
            self._progress_timer = None

    # -- the write -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the sessions changed since the last flush (whole: their read progress too), in one
        write; the output held for them goes out once it is durable."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, set()
        unheld, self._unheld = self._unheld - dirty, set()
        if self._progressed:
            self._progressed -= dirty | unheld
        items = []
        for client_id in (*dirty, *unheld):
            session = self.sessions.get(client_id)
            if session is not None and session.persistent:
                items.append((client_id, session.to_json()))
        number = self._next
        self._next += 1
        try:
            answered = self.repository.save(items) if items else None
        except StoreError as exc:  # (a local store: the disk refused; the held output is dropped)
            self._failures.log(logging.WARNING, type(exc).__name__, "sessions not saved write=%d error=%s",
                               number, exc)
            self.failure = exc
            self._write_again(client_id for client_id, _ in items)
            self._finish(number, False)
            return
        if items and answered is None:
            self.failure = None
        for client_id, _ in items:
            self._saved(client_id)
        if answered is None:
            self._finish(number, True)
            return
        for client_id, _ in items:
            if client_id not in unheld:
                self._unanswered[client_id] = number
        written = [client_id for client_id, _ in items]
        asyncio.ensure_future(answered).add_done_callback(lambda done: self._answered(number, done, written))

    def _answered(self, number: int, done: asyncio.Future[None], written: list[str]) -> None:
        error = "cancelled" if done.cancelled() else done.exception()
        if error is not None:
            self._failures.log(logging.WARNING, type(error).__name__, "sessions not saved write=%d error=%s",
                               number, error)
            self._write_again(written)
        self.failure = None if error is None else (error if isinstance(error, BaseException) else StoreError(error))
        self._finish(number, error is None)

    def _write_again(self, client_ids: Iterable[str]) -> None:
        """Sessions whose write failed are written again with the progress saves, at least a
        second later (a full disk: until space is back and the store takes them), which also
        tells ``failure`` when writes succeed again."""
        self._progressed.update(client_ids)
        if self._progress_timer is None:
            self._progress_timer = asyncio.get_running_loop().call_later(max(self.progress_interval_s, 1.0),
                                                                         self._flush_progress)

    def _finish(self, number: int, ok: bool) -> None:
        self._finished.add(number)
        while self._durable + 1 in self._finished:
            self._durable += 1
            self._finished.discard(self._durable)
        if self._unanswered:
            self._unanswered = {c: n for c, n in self._unanswered.items() if n > self._durable}
        if not self._held:
            return
        # (an output's abort closes it, which writes the sessions again: what it changes of
        # ``_held`` meanwhile is seen through ``pop``)
        for output, held in list(self._held.items()):
            if not ok and any(n == number for n, _ in held):
                self._held.pop(output, None)  # what it sent on that state must not leave: the client retries
                output.abort()
                continue
            ready = 0
            while ready < len(held) and held[ready][0] <= self._durable:
                ready += 1
            if ready:
                output.write_now(b"".join(data for _, data in held[:ready]))
                del held[:ready]
            if not held and self._held.pop(output, None) is not None:
                output.released()

    # -- the output that waits -------------------------------------------------------------------
    def write(self, output: MQTTConnection, data: bytes, client_id: str) -> None:
        """``data`` goes to ``output`` now, or -- while the session of ``client_id`` has changes
        not yet durable -- once they are (and always behind what ``output`` holds already)."""
        if client_id in self._dirty:
            need = self._next
        else:
            need = self._unanswered.get(client_id, 0) if self._unanswered else 0
        held = self._held.get(output)
        if held:
            need = max(need, held[-1][0])
        if need <= self._durable:
            output.write_now(data)
            return
        if held is None:
            held = self._held[output] = []
        held.append((need, data))

    def holds(self, output: MQTTConnection) -> bool:
        return output in self._held

    def drop(self, output: MQTTConnection) -> None:
        """Its socket is gone: what it holds never leaves."""
        self._held.pop(output, None)
