"""The write-ahead rule of gateway/mqtt/session_saves.py with a repository that answers later (a
gateway node's store node): output waits for the write that covers its session, in order,
behind an earlier write still unanswered; a failed write drops what waited for it."""

from __future__ import annotations

import asyncio

from gateway.mqtt.session import Session
from gateway.mqtt.session_saves import SessionSaves
from store import StoreWriteError


class LateRepository:
    """Answers each ``save`` when the test says so."""

    keeps_offline = True

    def __init__(self) -> None:
        self.writes: list[tuple[list[str], asyncio.Future[None]]] = []

    def save(self, sessions):
        answer = asyncio.get_running_loop().create_future()
        self.writes.append(([client_id for client_id, _ in sessions], answer))
        return answer


class Output:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False
        self.releases = 0

    def write_now(self, data: bytes) -> None:
        self.written.append(data)

    def released(self) -> None:
        self.releases += 1

    def abort(self) -> None:
        self.aborted = True


def saves_of(*client_ids: str) -> tuple[SessionSaves, LateRepository, dict[str, Session]]:
    sessions = {c: Session(c, 5, 60) for c in client_ids}
    repository = LateRepository()
    return SessionSaves(repository, sessions, 1.0, lambda _: None), repository, sessions  # type: ignore[arg-type]


async def test_output_waits_for_the_write_that_covers_it_and_stays_in_order() -> None:
    saves, repository, sessions = saves_of("a")
    out = Output()
    saves.write(out, b"0", "a")  # nothing unsaved: at once
    saves.mark_dirty(sessions["a"])
    saves.write(out, b"1", "a")
    await asyncio.sleep(0)  # the end of the turn: write 1 goes to the repository
    saves.mark_dirty(sessions["a"])
    saves.write(out, b"2", "a")
    await asyncio.sleep(0)  # write 2, while 1 is unanswered
    saves.write(out, b"3", "a")  # nothing new, but behind what waits for write 2
    assert out.written == [b"0"] and len(repository.writes) == 2
    repository.writes[1][1].set_result(None)  # answered out of order: 1 is still unanswered
    await asyncio.sleep(0)
    assert out.written == [b"0"]
    repository.writes[0][1].set_result(None)
    await asyncio.sleep(0)
    assert out.written == [b"0", b"123"] and out.releases == 1 and not saves.holds(out)


async def test_a_failed_write_drops_what_waited_for_it_and_holds_no_other_session() -> None:
    saves, repository, sessions = saves_of("a", "b")
    failing, other = Output(), Output()
    saves.mark_dirty(sessions["a"])
    saves.write(failing, b"PUBREL", "a")
    saves.write(other, b"PUBACK", "b")  # b has nothing unsaved
    assert other.written == [b"PUBACK"]
    await asyncio.sleep(0)
    repository.writes[0][1].set_exception(ConnectionError("store node gone"))
    await asyncio.sleep(0)
    assert failing.aborted and failing.written == [] and not saves.holds(failing)


class FullDiskRepository:
    """A local store on a full disk: every ``save`` raises at once."""

    keeps_offline = True

    def save(self, sessions):
        raise StoreWriteError("meta write failed: No space left on device")


async def test_a_write_refused_at_once_drops_what_waited_and_holds_nothing_unheld() -> None:
    sessions = {c: Session(c, 5, 60) for c in ("a", "b")}
    saves = SessionSaves(FullDiskRepository(), sessions, 1.0, lambda _: None)  # type: ignore[arg-type]
    suback, connack = Output(), Output()
    saves.mark_dirty(sessions["a"])
    saves.write(suback, b"SUBACK", "a")
    saves.mark_dirty(sessions["b"], holds_output=False)  # a connect's bookkeeping
    saves.write(connack, b"CONNACK", "b")
    assert connack.written == [b"CONNACK"]
    await asyncio.sleep(0)  # the write fails: no exception escapes the loop's callback
    assert suback.aborted and suback.written == [] and not saves.holds(suback)
    assert isinstance(saves.failure, StoreWriteError)
    saves.write(connack, b"PUBLISH", "b")
    assert connack.written == [b"CONNACK", b"PUBLISH"] and not connack.aborted
