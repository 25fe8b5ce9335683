"""The embedded lookup: nodes in one event loop (``InProcessNetwork``, which can crash, slow
down or cut nodes) and over the TCP remoting transport on 127.0.0.1. What must hold: answers
are right, or in doubt (IN_DOUBT) within the deadline, never wrong in the way that misses a
takeover (a client live on one node located elsewhere, or nowhere), and the data is rebuilt
after membership changes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from lookup import embedded
from lookup.api import IN_DOUBT, LookupOptions
from lookup.embedded import EmbeddedLookup
from lookup.link import LookupCode, decode_reply, request_command
from lookup.tcp import TcpTransport
from .lookup_network import InProcessNetwork
from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import FrameReader, RemotingCommand, encode

OPTIONS = LookupOptions(heartbeat_s=0.05, node_ttl_s=0.4, settle_s=0.15, deadline_s=0.1)


async def eventually(check: Callable[[], object], timeout: float = 3.0, what: str = "") -> None:
    """Poll an async check until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not true within {timeout} s: {what or check}")
        await asyncio.sleep(0.02)


def keys_owned_by(lookup: EmbeddedLookup, node: str, count: int = 1, prefix: str = "k") -> list[str]:
    ring = lookup._membership.ring
    keys = [k for k in (f"{prefix}{i}" for i in range(10_000)) if ring.owner(k) == node]
    return keys[:count]


async def settled(nodes: list[EmbeddedLookup]) -> None:
    """Every node answers for keys of every owner: same view, rebuilt, nothing unsynced."""
    names = {n.node_id for n in nodes}

    async def all_answer() -> bool:
        if any(n.nodes() != names for n in nodes):
            return False
        probes = [keys_owned_by(nodes[0], owner, prefix="probe-")[0] for owner in sorted(names)]
        answers = [await n.where_is(p) for n in nodes for p in probes]
        return all(a is not IN_DOUBT for a in answers)

    await eventually(all_answer, what=f"nodes {sorted(names)} settle")


async def start_cluster(network: InProcessNetwork, names: str,
                        options: LookupOptions = OPTIONS) -> dict[str, EmbeddedLookup]:
    nodes = {name: EmbeddedLookup(name, network.transport(name), options) for name in names}
    for node in nodes.values():
        await node.start()
    await settled(list(nodes.values()))
    return nodes


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[InProcessNetwork, dict[str, EmbeddedLookup]]]:
    network = InProcessNetwork()
    nodes = await start_cluster(network, "abc")
    yield network, nodes
    for node in nodes.values():
        await node.close(leave=False)


async def test_takeover_and_where_is(cluster) -> None:
    _, n = cluster
    assert await n["a"].client_online("dev-1") is None
    assert await n["b"].client_online("dev-1") == "a"  # b disconnects it on a
    assert await n["c"].where_is("dev-1") == "b"
    await n["a"].client_offline("dev-1")  # a's late offline does not undo the takeover
    assert await n["c"].where_is("dev-1") == "b"
    await n["c"].client_online("dev-2")
    listing = await n["a"].clients(prefix="dev-")
    assert listing.complete and listing.clients == [("dev-1", "b"), ("dev-2", "c")]
    assert (await n["a"].clients(prefix="dev-", limit=1)).clients == [("dev-1", "b")]
    await n["b"].client_offline("dev-1")
    assert await n["a"].where_is("dev-1") is None
    with pytest.raises(ValueError):
        await n["a"].client_online("dev-3", "b")  # a registers only its own connections


async def test_an_owner_that_does_not_answer_is_in_doubt_within_the_deadline(cluster) -> None:
    network, n = cluster
    [client] = keys_owned_by(n["a"], "c")
    await n["b"].client_online(client)
    network.slow("c", 1.0)
    started = time.monotonic()
    assert await n["a"].where_is(client) is IN_DOUBT
    assert await n["a"].where_is(client) is IN_DOUBT
    elapsed = time.monotonic() - started
    assert elapsed < 2 * OPTIONS.deadline_s + 0.1
    assert n["a"].stats.broadcast_fallbacks["deadline"] == 2
    network.slow("c", 0.0)
    network.crash("c")
    started = time.monotonic()
    assert await n["a"].where_is(client) is IN_DOUBT
    assert time.monotonic() - started < OPTIONS.deadline_s  # refused: no need to wait
    assert n["a"].stats.broadcast_fallbacks["unreachable"] == 1
    network.revive("c")
    await eventually(lambda: _equals(n["a"].where_is(client), "b"), what="c answers again")


async def _equals(answer, expected) -> bool:
    return await answer == expected


async def test_a_failed_write_makes_the_owner_unsynced_until_repaired(cluster) -> None:
    network, n = cluster
    [client] = keys_owned_by(n["a"], "c", prefix="dev-")
    network.cut("a", "c")
    assert await n["a"].client_online(client) is IN_DOUBT  # a kicks it on every node
    # b is told at once that c misses a write of a's: it asks every node rather than trust c
    await eventually(lambda: _equals(n["b"].where_is(client), IN_DOUBT), timeout=0.5, what="b in doubt")
    assert n["b"].stats.broadcast_fallbacks["unsynced"] >= 1
    network.heal("a", "c")
    await eventually(lambda: _equals(n["b"].where_is(client), "a"), what="a's re-registration reaches c")


async def test_membership_change_is_in_doubt_then_rebuilt() -> None:
    # re-registrations reach the new node late (but within the deadline): longer than the
    # settle time and a heartbeat, so only the owner's wait for every sync keeps answers right
    options = LookupOptions(heartbeat_s=0.05, node_ttl_s=0.4, settle_s=0.15, deadline_s=0.5)
    network = InProcessNetwork()
    n = await start_cluster(network, "abc", options)
    clients = {f"dev-{i}": "abc"[i % 3] for i in range(150)}
    for client, node in clients.items():
        await n[node].client_online(client)

    wrong: list[str] = []
    doubts = 0
    stop = asyncio.Event()
    watched = list(clients.items())[:60]

    async def watch(reader: EmbeddedLookup, live: Callable[[], set[str]]) -> None:
        """Every answer must be the node the client is on, or none once that node is gone
        (another node, or none for a live client, would miss a takeover)."""
        nonlocal doubts
        while not stop.is_set():
            for client, node in watched:
                answer = await reader.where_is(client)
                if answer is IN_DOUBT:
                    doubts += 1
                elif answer != node and not (answer is None and node not in live()):
                    wrong.append(f"{client} on {node}: located at {answer}")
            await asyncio.sleep(0.005)

    # a fourth node joins: some keys move to it; it must get them from the others' live state
    live = {"a", "b", "c", "d"}
    watcher = asyncio.create_task(watch(n["a"], lambda: live))
    d = EmbeddedLookup("d", network.transport("d"), options)
    network.slow("d", 0.3, ops={"batch"})
    await d.start()
    try:
        await settled([*n.values(), d])
        network.slow("d", 0.0)
        assert doubts > 0  # the change was in doubt for a while
        moved = [c for c in clients if d._membership.ring.owner(c) == "d"]
        assert moved, "some clients must have moved to d"
        for client in moved:
            assert await d.where_is(client) == clients[client]  # rebuilt on d, from a, b and c
        for client, node in list(clients.items())[:40]:
            assert await d.where_is(client) == node

        # c crashes: after its TTL it is gone with its entries; its keys are rebuilt elsewhere
        network.crash("c")
        live.discard("c")
        survivors = [n["a"], n["b"], d]
        await settled(survivors)
        for client, node in clients.items():
            assert await d.where_is(client) == (None if node == "c" else node)
        listing = await n["a"].clients(limit=1000)
        assert listing.complete and len(listing.clients) == 100
    finally:
        stop.set()
        await watcher
        for node in (*n.values(), d):
            await node.close(leave=False)
    assert not wrong, wrong[:5]
    assert n["a"].stats.broadcast_fallbacks["settling"] > 0


async def test_rebuild_in_chunks_keeps_later_writes_in_order(monkeypatch) -> None:
    monkeypatch.setattr(embedded, "_SYNC_CHUNK", 7)
    network = InProcessNetwork()
    n = await start_cluster(network, "abc")
    d = EmbeddedLookup("d", network.transport("d"), OPTIONS)
    try:
        for i in range(300):
            await n["a"].client_online(f"dev-{i}")
        missing: list[str] = []
        stop = asyncio.Event()

        async def watch() -> None:  # a keeps its odd clients online throughout
            while not stop.is_set():
                for i in range(1, 300, 2):
                    answer = await n["b"].where_is(f"dev-{i}")
                    if answer is not IN_DOUBT and answer != "a":
                        missing.append(f"dev-{i}: {answer}")
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        # d gets a's re-registration (~75 clients) in ~11 chunks of 7, 30 ms each: longer
        # than the settle time
        network.slow("d", 0.03, ops={"batch"})
        await d.start()
        for start in range(0, 300, 30):  # while d is rebuilt, a's live state keeps changing
            await asyncio.gather(*(n["a"].client_offline(f"dev-{i}") for i in range(start, start + 30, 2)))
            await asyncio.sleep(0.01)
        for i in range(300, 320):
            await n["a"].client_online(f"dev-{i}")
        await settled([*n.values(), d])
        network.slow("d", 0.0)
        stop.set()
        await watcher
        assert not missing, missing[:5]
        assert n["a"].stats.resyncs >= 3  # one per peer at least
        for i in range(320):
            expected = "a" if i % 2 or i >= 300 else None
            assert await n["b"].where_is(f"dev-{i}") == expected
            assert await d.where_is(f"dev-{i}") == expected
    finally:
        for node in (*n.values(), d):
            await node.close(leave=False)


async def test_a_restarted_node_replaces_its_old_entries(cluster) -> None:
    network, n = cluster
    await n["b"].client_online("old-session")
    await n["b"].close(leave=False)  # restarts before its TTL: no expiry in between
    b2 = EmbeddedLookup("b", network.transport("b"), OPTIONS)
    await b2.start()
    try:
        nodes = [n["a"], b2, n["c"]]
        await settled(nodes)
        assert await n["a"].where_is("old-session") is None
        assert await b2.client_online("new-session") is None
        assert await n["c"].where_is("new-session") == "b"
    finally:
        await b2.close()


async def test_a_node_that_leaves_is_gone_before_its_ttl(cluster) -> None:
    _, n = cluster
    await n["c"].client_online("on-c")
    await n["a"].client_online("on-a")
    started = time.monotonic()
    await n["c"].close(leave=True)
    await settled([n["a"], n["b"]])
    assert time.monotonic() - started < OPTIONS.node_ttl_s + OPTIONS.settle_s
    assert await n["b"].where_is("on-c") is None and await n["b"].where_is("on-a") == "a"


# -- over TCP ------------------------------------------------------------------------------
async def test_three_nodes_over_the_remoting_transport() -> None:
    transports = {name: TcpTransport(name, "127.0.0.1", 0) for name in ("a", "b", "c")}
    for transport in transports.values():
        await transport.start()
    for transport in transports.values():
        for name, other in transports.items():
            if name != transport.node_id:
                transport.add_peer(name, other.address)
    nodes = {name: EmbeddedLookup(name, t, OPTIONS) for name, t in transports.items()}
    try:
        for node in nodes.values():
            await node.start()
        await settled(list(nodes.values()))
        assert await nodes["a"].client_online("dev-1") is None
        assert await nodes["b"].client_online("dev-1") == "a"
        assert await nodes["c"].where_is("dev-1") == "b"
        owned = [keys_owned_by(nodes["a"], owner, prefix="t/")[0] for owner in ("a", "b", "c")]
        for client in owned:  # one client per owner, all online at a
            assert await nodes["a"].client_online(client) is None
            assert await nodes["b"].where_is(client) == "a"

        # the wire itself: a raw remoting client gets a JSON reply to a HEARTBEAT
        reader, writer = await asyncio.open_connection(*transports["b"].address)
        writer.write(encode(request_command(nodes["a"]._heartbeat_message(), opaque=99)))
        writer.write(encode(RemotingCommand(10, opaque=100)))  # SEND_MESSAGE: not served here
        frames = FrameReader()
        replies: list[RemotingCommand] = []
        while len(replies) < 2:
            replies += frames.feed(await asyncio.wait_for(reader.read(65536), 2))
        writer.close()
        assert replies[0].opaque == 99 and decode_reply(replies[0])["node"] == "b"
        assert replies[1].code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert LookupCode.HEARTBEAT == 30_200

        # c dies without a word: its keys are in doubt at once (refused), then rebuilt
        await nodes["c"].close(leave=False)
        started = time.monotonic()
        assert await nodes["a"].where_is(owned[2]) is IN_DOUBT
        assert time.monotonic() - started < OPTIONS.deadline_s + 0.05
        await settled([nodes["a"], nodes["b"]])
        for client in owned:
            assert await nodes["b"].where_is(client) == "a"
        assert await nodes["a"].where_is("dev-1") == "b"
    finally:
        for node in nodes.values():
            await node.close(leave=False)
