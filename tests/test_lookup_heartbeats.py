"""lookup/heartbeats.py: the heartbeat loop of both lookup backends goes on after a failed beat
and stops once the lookup is closed."""

from __future__ import annotations

import logging

from lookup.heartbeats import beat_until_closed


async def test_a_failed_beat_is_logged_and_the_beats_go_on(caplog) -> None:
    beats: list[int] = []

    async def beat() -> None:
        beats.append(len(beats))
        if len(beats) == 2:
            raise RuntimeError("redis went away")

    with caplog.at_level(logging.ERROR, logger="tidemq.lookup"):
        await beat_until_closed(lambda: len(beats) >= 4, 0.0, beat, "node-a")
    assert beats == [0, 1, 2, 3]
    assert [r.getMessage() for r in caplog.records] == ["lookup heartbeat failed node=node-a"]


async def test_a_closed_lookup_beats_no_more() -> None:
    beats: list[int] = []

    async def beat() -> None:
        beats.append(1)

    await beat_until_closed(lambda: True, 0.0, beat, "node-a")
    assert beats == []
