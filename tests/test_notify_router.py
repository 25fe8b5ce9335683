"""NotifyRouter: events go to the nodes the lookup names, plus those that said they read the
queue; to every node while the lookup has not answered or is in doubt."""

from __future__ import annotations

import asyncio

from gateway.cluster.notify_router import NotifyRouter


async def test_routes_by_lookup_answers_hints_and_broadcasts_when_in_doubt() -> None:
    answers: dict[str, frozenset[str] | None] = {"q1": frozenset({"a"}), "q2": None}
    asked: list[str] = []

    async def nodes_for(queue: str) -> frozenset[str] | None:
        asked.append(queue)
        return answers[queue]

    router = NotifyRouter(nodes_for, refresh_s=60.0)
    for node in ("a", "b", "c"):
        router.node_joined(node)
    # no answer yet: every node, and the lookup is asked (once)
    assert router.route({"q1": 5}) == {"a": {"q1": 5}, "b": {"q1": 5}, "c": {"q1": 5}}
    assert router.route({"q1": 6}) == {"a": {"q1": 6}, "b": {"q1": 6}, "c": {"q1": 6}}
    await asyncio.sleep(0)
    assert asked == ["q1"]
    assert router.route({"q1": 7}) == {"a": {"q1": 7}}  # answered: only there
    router.hint("q1", "c", True)  # c starts reading before the lookup knows
    assert router.route({"q1": 8}) == {"a": {"q1": 8}, "c": {"q1": 8}}
    # the lookup in doubt about q2: broadcast, counted
    router.route({"q2": 1})
    await asyncio.sleep(0)
    assert router.route({"q2": 2}) == {"a": {"q2": 2}, "b": {"q2": 2}, "c": {"q2": 2}}
    assert router.stats.fallbacks["lookup in doubt"] >= 1 and router.stats.targeted == 2
    router.node_left("c")
    assert router.route({"q1": 9}) == {"a": {"q1": 9}}


async def test_without_a_lookup_hints_route_alone() -> None:
    router = NotifyRouter(None)
    for node in ("a", "b"):
        router.node_joined(node)
    assert router.route({"q": 1}) == {}  # nobody reads it
    router.hint("q", "b", True)
    assert router.route({"q": 2}) == {"b": {"q": 2}}
    router.hint("q", "b", False)
    assert router.route({"q": 3}) == {}


def test_broadcast_mode_sends_everything_everywhere() -> None:
    router = NotifyRouter(None, broadcast=True)
    router.node_joined("a")
    router.node_joined("b")
    router.hint("q", "a", True)
    assert router.route({"q": 1, "r": 2}) == {"a": {"q": 1, "r": 2}, "b": {"q": 1, "r": 2}}
    assert router.stats.broadcast == 2
