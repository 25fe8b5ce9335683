"""The Redis lookup against a real redis-server that each test starts on a free port with a
temporary dir (installed by scripts/system-deps.sh), and stops by its PID: basic operations,
expiry of a silent node by TTL, and Redis stopped (or paused) mid-run: answers turn into
"in doubt" (broadcast), counted, and are right again once Redis is back and the nodes have
re-registered their live state. No answer may ever miss a live interested node."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from lookup.api import IN_DOUBT, LookupOptions
from lookup.redis_backend import RedisLookup

from .ports import free_port

OPTIONS = LookupOptions(heartbeat_s=0.05, node_ttl_s=0.4, settle_s=0.15, deadline_s=0.1)


class RedisServer:
    """One redis-server without persistence; ``stop`` and ``start`` again keep the port, so a
    restart is Redis coming back empty."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: the lookup's Redis tests need it; "
                        "run scripts/system-deps.sh as root (apt-get install redis-server)")
        self.binary = binary
        self.data_dir = data_dir
        self.port = free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.data_dir), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        deadline = time.monotonic() + 5
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(b"PING\r\n")
                pong = await asyncio.wait_for(reader.readline(), 1)
                writer.close()
                if pong == b"+PONG\r\n":
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.returncode is not None:
                pytest.fail(f"redis-server did not start on port {self.port}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # in case a test paused it
        os.kill(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()

    def pause(self, paused: bool) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def start_nodes(redis_server: RedisServer) -> AsyncIterator[Callable]:
    started: list[RedisLookup] = []

    async def start(*names: str, options: dict[str, LookupOptions] | None = None) -> dict[str, RedisLookup]:
        options = options or {}
        nodes = {name: RedisLookup(name, redis_server.url, options.get(name, OPTIONS)) for name in names}
        for node in nodes.values():
            await node.start()
        started.extend(nodes.values())
        await settled(list(nodes.values()))
        return nodes

    yield start
    for node in started:
        await node.close(leave=False)


async def eventually(check: Callable[[], object], timeout: float = 3.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not true within {timeout} s: {what or check}")
        await asyncio.sleep(0.02)


async def settled(nodes: list[RedisLookup]) -> None:
    names = {n.node_id for n in nodes}

    async def all_answer() -> bool:
        return (all(names <= n.nodes() for n in nodes)
                and all([await n.nodes_for("probe") is not None for n in nodes]))

    await eventually(all_answer, what=f"nodes {sorted(names)} settle")


async def _equals(answer, expected) -> bool:
    return await answer == expected


async def _true(value: bool) -> bool:
    return value


async def test_basic_operations(start_nodes, redis_server: RedisServer) -> None:
    n = await start_nodes("a", "b")
    assert await n["a"].client_online("dev-1") is None
    assert await n["b"].client_online("dev-1") == "a"  # b disconnects it on a
    assert await n["a"].where_is("dev-1") == "b"
    await n["a"].client_offline("dev-1")  # a's late offline does not undo the takeover
    assert await n["a"].where_is("dev-1") == "b"
    for client in ("x*1", "x?2", "xa3"):
        await n["a"].client_online(client)
    listing = await n["b"].clients(prefix="x*")  # glob characters are literal
    assert listing.complete and listing.clients == [("x*1", "a")]
    assert (await n["b"].clients(limit=2)).clients == [("dev-1", "b"), ("x*1", "a")]
    await n["b"].client_offline("dev-1")
    assert await n["a"].where_is("dev-1") is None

    assert await n["a"].add_interest("s/+/t") and await n["a"].add_interest("s/+/t")
    assert await n["b"].add_interest("s/+/t")
    assert await n["b"].nodes_for("s/+/t") == {"a", "b"}
    await n["a"].remove_interest("s/+/t")
    assert await n["b"].nodes_for("s/+/t") == {"a", "b"}  # a still has one session
    await n["a"].remove_interest("s/+/t")
    assert await n["a"].nodes_for("s/+/t") == {"b"}
    assert await n["a"].nodes_for("nobody") == frozenset()
    assert n["a"].nodes() == {"a", "b"}
    assert n["a"].stats.write_failures == 0

    await n["a"].add_interest("x")
    await n["a"].close()  # a clean close takes a's entries along at once, not at its TTL
    assert await n["b"].nodes_for("x") == frozenset()
    assert await n["b"].where_is("xa3") is None


async def test_a_silent_node_expires_by_ttl(start_nodes, redis_server: RedisServer) -> None:
    n = await start_nodes("a", "b", "c")
    await n["c"].client_online("dev-c")
    await n["c"].add_interest("q")
    await n["a"].add_interest("q")
    assert await n["b"].nodes_for("q") == {"a", "c"}
    stopped = time.monotonic()
    await n["c"].close(leave=False)  # stops heart-beating, says nothing
    await eventually(lambda: _equals(n["b"].nodes_for("q"), {"a"}), what="c's interest expires")
    assert time.monotonic() - stopped > OPTIONS.node_ttl_s / 2  # by the TTL, not at once
    assert await n["a"].where_is("dev-c") is None
    await eventually(lambda: _true(n["a"].nodes() == {"a", "b"}), what="c leaves nodes()")
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:  # and a live node's heartbeat collected c's entries
        assert await client.hget("tidemq:lookup:clients", "dev-c") is None
        assert await client.smembers("tidemq:lookup:interest:q") == {"a"}
    finally:
        await client.aclose()


async def test_redis_down_means_broadcast_and_recovers(start_nodes, redis_server: RedisServer) -> None:
    # a settles fast; b heart-beats late after the restart and has much to re-register: what
    # keeps a from answering without b's entries is waiting for b's heartbeat (which claims
    # b's rebuild) and then for b's rebuild to end
    options = LookupOptions(heartbeat_s=0.05, node_ttl_s=1.0, settle_s=0.05, deadline_s=0.1)
    n = await start_nodes("a", "b", options={"a": options, "b": options})
    a, b = n["a"], n["b"]
    await a.client_online("dev-a")
    await a.add_interest("q1")
    await b.add_interest("q1")
    bulk = [f"bulk/{i}" for i in range(30_000)]
    required = {"q1": {"a", "b"}, "q2": set(), bulk[0]: set(), bulk[-1]: set()}  # live interests

    missing: list[str] = []
    stop = asyncio.Event()

    async def watch() -> None:
        """An answer may be None, never one that misses a live interested node."""
        while not stop.is_set():
            for queue, holders in list(required.items()):
                answer = await a.nodes_for(queue)
                if answer is not None and not holders <= answer:
                    missing.append(f"{queue}: {sorted(answer)} without {sorted(holders - answer)}")
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    try:
        await redis_server.stop()
        started = time.monotonic()
        assert await a.nodes_for("q1") is None
        assert await b.where_is("dev-a") is IN_DOUBT
        assert time.monotonic() - started < 2 * options.deadline_s + 0.1
        assert await b.client_online("dev-b") is IN_DOUBT  # the caller kicks it everywhere
        required["q2"] = {"b"}
        assert await b.add_interest("q2") is False  # registered once Redis is back
        assert not (await a.clients()).complete
        assert a.stats.broadcast_fallbacks["unreachable"] >= 1
        for queue in bulk:  # sessions subscribing during the outage, without a word to Redis
            b._registry.add_interest(queue)
        required[bulk[0]] = required[bulk[-1]] = {"b"}

        b._task.cancel()  # b's heartbeats stall (less than its TTL)
        await redis_server.start()  # back, and empty
        await asyncio.sleep(0.3)  # a's settle time is long over, b has not heart-beaten
        assert await a.nodes_for("q1") is None
        await b.heartbeat()  # b finds Redis empty and re-registers 30,003 entries
        b._task = asyncio.create_task(b._run())
        await eventually(lambda: _equals(a.nodes_for("q1"), {"a", "b"}), what="q1 answered again")
        assert await a.nodes_for("q2") == {"b"}  # registered during the outage: rebuilt
        assert await a.nodes_for(bulk[-1]) == {"b"}
        assert await a.where_is("dev-b") == "b"
        await eventually(lambda: _equals(b.where_is("dev-a"), "a"), what="b answers again")
        assert await a.client_online("dev-b") == "b"
    finally:
        stop.set()
        await watcher
    assert not missing, missing[:5]
    assert a.stats.resyncs >= 2 and b.stats.resyncs >= 2
    assert a.stats.fallbacks >= 2


async def test_a_paused_redis_is_in_doubt_within_the_deadline(start_nodes, redis_server: RedisServer) -> None:
    n = await start_nodes("a", "b")
    await n["b"].add_interest("q")
    redis_server.pause(True)
    try:
        started = time.monotonic()
        assert await n["a"].nodes_for("q") is None
        assert time.monotonic() - started < OPTIONS.deadline_s + 0.1
        assert n["a"].stats.broadcast_fallbacks["deadline"] >= 1
    finally:
        redis_server.pause(False)
    await eventually(lambda: _equals(n["a"].nodes_for("q"), {"b"}), what="answers after the pause")
