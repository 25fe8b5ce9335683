"""The Redis lookup (redis-py asyncio), for users who run Redis: the same ``Lookup`` as the
embedded one, with Redis as the owner of every key, and an ``InterestLookup``: the store node
reads the gateway nodes' queue interests from the same Redis to route notify events. Each
operation is one Lua script, so it is atomic and one round trip; any Redis error or a reply
slower than ``deadline_s`` makes the answer "in doubt" (counted), never an exception. The
client reconnects by itself.

Keys, under ``prefix`` (one Redis, not Redis Cluster: the scripts build keys themselves):
    gen               a random token naming this Redis's data; gone after a restart without
                      persistence, so every node notices that its entries were lost
    node:<node>       the node's incarnation, expiring after ``node_ttl_s`` unless heart-beaten:
                      entries of a node without it stop counting, and are collected
    nodes             set of node ids that registered (for collection and ``nodes()``)
    syncing           sorted set: nodes re-registering, scored by when that claim expires
    clients           hash client id -> node
    interest:<queue>  set of nodes with interested sessions
    nclients:<node>, ninterests:<node>   what a node registered, to replace or collect it

Rebuild: a node re-registers everything it holds (its ``LocalRegistry``) when its key had
expired, when ``gen`` changed, or after one of its writes failed; it announces itself in
``syncing`` first (atomically with the heartbeat that found the need) and leaves it when done.
In doubt while: this node's heartbeat fails, or Redis answers again (or with a new ``gen``)
since less than ``settle_s`` or before every node live until then has heart-beaten (claiming its
rebuild) or had ``node_ttl_s`` to do so; while ``gen`` is not the one this node re-registered
under; while any node is re-registering.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError


from .api import (
    IN_DOUBT,
    ClientList,
    FallbackReason,
    InDoubt,
    InterestLookup,
    LocalRegistry,
    LookupOptions,
    LookupStats,
    smallest,
)
from .heartbeats import beat_until_closed, stop_tasks

log = logging.getLogger("tidemq.lookup")

_CHUNK = 500  # entries per re-registration script

_PRELUDE = """
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function alive(node)
  return redis.call('EXISTS', P .. 'node:' .. node) == 1
end
local function doubt(gen)
  if redis.call('GET', P .. 'gen') ~= gen then return 'rebuilding' end
  if redis.call('ZCOUNT', P .. 'syncing', now_ms(), '+inf') > 0 then return 'rebuilding' end
  return false
end
local function clear_node(node)
  local ck = P .. 'nclients:' .. node
  for _, c in ipairs(redis.call('SMEMBERS', ck)) do
    if redis.call('HGET', P .. 'clients', c) == node then redis.call('HDEL', P .. 'clients', c) end
  end
  redis.call('DEL', ck)
  local qk = P .. 'ninterests:' .. node
  for _, q in ipairs(redis.call('SMEMBERS', qk)) do
    redis.call('SREM', P .. 'interest:' .. q, node)
  end
  redis.call('DEL', qk)
end
"""

# ARGV: prefix, node, incarnation, ttl ms, new gen, the gen this node synced under, dirty (0/1)
# -> {gen, 1 when the node must re-register}
_HEARTBEAT = _PRELUDE + """
local node, inc, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
local gen = redis.call('GET', P .. 'gen')
if not gen then
  gen = ARGV[5]
  redis.call('SET', P .. 'gen', gen)
end
local prev = redis.call('SET', P .. 'node:' .. node, inc, 'PX', ttl, 'GET')
redis.call('SADD', P .. 'nodes', node)
if prev ~= inc or gen ~= ARGV[6] or ARGV[7] == '1' or redis.call('ZSCORE', P .. 'syncing', node) then
  redis.call('ZADD', P .. 'syncing', now_ms() + ttl, node)
  return {gen, 1}
end
return {gen, 0}
"""

# ARGV: prefix, node, ttl ms -> 1. Drops what the node registered before its re-registration.
_BEGIN_SYNC = _PRELUDE + """
clear_node(ARGV[2])
redis.call('ZADD', P .. 'syncing', now_ms() + tonumber(ARGV[3]), ARGV[2])
return 1
"""

# ARGV: prefix, node, client count, clients..., queues... -> 1. A client held by another live
# node stays there: that registration is newer.
_REGISTER = _PRELUDE + """
local node, n = ARGV[2], tonumber(ARGV[3])
for i = 4, 3 + n do
  local c = ARGV[i]
  local holder = redis.call('HGET', P .. 'clients', c)
  if not holder or holder == node or not alive(holder) then
    redis.call('HSET', P .. 'clients', c, node)
    redis.call('SADD', P .. 'nclients:' .. node, c)
  end
end
for i = 4 + n, #ARGV do
  redis.call('SADD', P .. 'interest:' .. ARGV[i], node)
  redis.call('SADD', P .. 'ninterests:' .. node, ARGV[i])
end
return 1
"""

# ARGV: prefix, node, gen -> 1 when the rebuild counts (Redis did not lose it meanwhile)
_END_SYNC = _PRELUDE + """
if redis.call('GET', P .. 'gen') ~= ARGV[3] then return 0 end
redis.call('ZREM', P .. 'syncing', ARGV[2])
return 1
"""

# ARGV: prefix, gen, node, client -> {'ok', previous node or ''} | {'doubt', reason}
_ONLINE = _PRELUDE + """
local node, c = ARGV[3], ARGV[4]
local holder = redis.call('HGET', P .. 'clients', c)
redis.call('HSET', P .. 'clients', c, node)
redis.call('SADD', P .. 'nclients:' .. node, c)
local d = doubt(ARGV[2])
if d then return {'doubt', d} end
if holder and holder ~= node and alive(holder) then return {'ok', holder} end
return {'ok', ''}
"""

# ARGV: prefix, gen, node, client -> {'ok'}
_OFFLINE = _PRELUDE + """
local node, c = ARGV[3], ARGV[4]
if redis.call('HGET', P .. 'clients', c) == node then redis.call('HDEL', P .. 'clients', c) end
redis.call('SREM', P .. 'nclients:' .. node, c)
return {'ok'}
"""

# ARGV: prefix, gen, node, queue, 1 to add | 0 to remove -> {'ok'} | {'doubt', reason}
_INTEREST = _PRELUDE + """
local node, q = ARGV[3], ARGV[4]
if ARGV[5] == '1' then
  redis.call('SADD', P .. 'interest:' .. q, node)
  redis.call('SADD', P .. 'ninterests:' .. node, q)
else
  redis.call('SREM', P .. 'interest:' .. q, node)
  redis.call('SREM', P .. 'ninterests:' .. node, q)
end
local d = doubt(ARGV[2])
if d then return {'doubt', d} end
return {'ok'}
"""

# ARGV: prefix, gen, queue -> {'ok', live nodes...} | {'doubt', reason}
_NODES_FOR = _PRELUDE + """
local d = doubt(ARGV[2])
if d then return {'doubt', d} end
local out = {'ok'}
for _, node in ipairs(redis.call('SMEMBERS', P .. 'interest:' .. ARGV[3])) do
  if alive(node) then out[#out + 1] = node end
end
return out
"""

# ARGV: prefix, gen, client -> {'ok', node or ''} | {'doubt', reason}
_WHERE = _PRELUDE + """
local d = doubt(ARGV[2])
if d then return {'doubt', d} end
local node = redis.call('HGET', P .. 'clients', ARGV[3])
if node and alive(node) then return {'ok', node} end
return {'ok', ''}
"""

# ARGV: prefix, gen -> {'ok' | 'doubt', live nodes...}; collects the entries of expired nodes
_NODES = _PRELUDE + """
local live = {doubt(ARGV[2]) and 'doubt' or 'ok'}
for _, node in ipairs(redis.call('SMEMBERS', P .. 'nodes')) do
  if alive(node) then
    live[#live + 1] = node
  else
    clear_node(node)
    redis.call('SREM', P .. 'nodes', node)
    redis.call('ZREM', P .. 'syncing', node)
  end
end
return live
"""

# ARGV: prefix, node -> 1. A clean close: this node's entries go now, not at its TTL.
_LEAVE = _PRELUDE + """
clear_node(ARGV[2])
redis.call('DEL', P .. 'node:' .. ARGV[2])
redis.call('SREM', P .. 'nodes', ARGV[2])
redis.call('ZREM', P .. 'syncing', ARGV[2])
return 1
"""

_GLOB_SPECIAL = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def _now() -> float:
    return time.monotonic()


class RedisLookup(InterestLookup):
    def __init__(self, node_id: str, url: str = "redis://127.0.0.1:6379/0", options: LookupOptions | None = None,
                 *, prefix: str = "tidemq:lookup:", incarnation: str | None = None) -> None:
        self.node_id = node_id
        self.options = options or LookupOptions()
        self.stats = LookupStats()
        self.prefix = prefix
        self.incarnation = incarnation or secrets.token_hex(6)
        deadline = self.options.deadline_s
        self._redis = aioredis.Redis.from_url(
            url, decode_responses=True, socket_timeout=deadline, socket_connect_timeout=deadline,
            # one immediate retry: a pooled connection that died with Redis fails once, then reconnects
            retry=Retry(NoBackoff(), 1), health_check_interval=0)
        self._scripts = {name: self._redis.register_script(text) for name, text in (
            ("heartbeat", _HEARTBEAT), ("begin_sync", _BEGIN_SYNC), ("register", _REGISTER),
            ("end_sync", _END_SYNC), ("online", _ONLINE), ("offline", _OFFLINE), ("interest", _INTEREST),
            ("nodes_for", _NODES_FOR), ("where", _WHERE), ("nodes", _NODES), ("leave", _LEAVE))}
        self._registry = LocalRegistry()
        self._gen = ""  # the gen this node's entries were last fully registered under
        self._dirty = False  # a write failed since the last re-registration
        self._down = True  # no successful heartbeat yet, or the last one failed
        self._settle_until = 0.0
        self._expect: set[str] = set()  # live nodes before Redis failed, not heart-beaten since
        self._expect_until = 0.0
        self._live: frozenset[str] = frozenset((node_id,))
        self._gate = asyncio.Event()  # closed while re-registering: writes wait, to stay in order
        self._gate.set()
        self._beat = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._kick: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.heartbeat()
        self._task = asyncio.create_task(self._run(), name=f"lookup-redis-heartbeat-{self.node_id}")

    async def close(self, leave: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        await stop_tasks(task for task in (self._task, self._kick) if task is not None)
        if leave:
            await self._script("leave", self.node_id)
        await self._redis.aclose()

    async def _run(self) -> None:
        await beat_until_closed(lambda: self._closed, self.options.heartbeat_s, self.heartbeat, self.node_id)

    async def heartbeat(self) -> None:
        async with self._beat:
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        ttl_ms = max(1, int(self.options.node_ttl_s * 1000))
        reply = await self._script("heartbeat", self.node_id, self.incarnation, ttl_ms, secrets.token_hex(8),
                                   self._gen, int(self._dirty))
        now = _now()
        if isinstance(reply, FallbackReason):
            if not self._down:
                log.warning("lookup redis unreachable node=%s reason=%s", self.node_id, reply.value)
            self._down = True
            return
        gen, must_sync = reply[0], int(reply[1])
        if self._down or gen != self._gen:
            # Redis answers again, or lost its data: the other nodes may not have noticed yet.
            # In doubt until every node live before has heart-beaten (and so claimed its
            # re-registration, in the same script) or has had its TTL to do so.
            self._settle_until = now + self.options.settle_s
            self._expect = set(self._live) - {self.node_id}
            self._expect_until = now + self.options.node_ttl_s
            if self._down:
                log.info("lookup redis reachable node=%s", self.node_id)
            self._down = False
        if must_sync:
            await self._resync(gen, ttl_ms)
        live = await self._script("nodes", self._gen)
        if not isinstance(live, FallbackReason):
            self._live = frozenset(live[1:]) | {self.node_id}
            self._expect -= self._live

    async def _resync(self, gen: str, ttl_ms: int) -> None:
        """Re-register this node's live state: drop what Redis holds for it, add it all again."""
        self._gate.clear()
        try:
            self._dirty = False  # a write failing from here on marks it again
            self.stats.resyncs += 1
            if isinstance(await self._script("begin_sync", self.node_id, ttl_ms), FallbackReason):
                self._dirty = True
                return
            clients, queues = list(self._registry.clients), list(self._registry.interests)
            for at in range(0, max(len(clients), len(queues)), _CHUNK):
                part_c, part_q = clients[at:at + _CHUNK], queues[at:at + _CHUNK]
                reply = await self._script("register", self.node_id, len(part_c), *part_c, *part_q)
                if isinstance(reply, FallbackReason):
                    self._dirty = True
                    return
            done = await self._script("end_sync", self.node_id, gen)
            if done == 1:
                self._gen = gen
                log.info("lookup re-registered node=%s clients=%d interests=%d", self.node_id,
                         len(clients), len(queues))
            else:
                self._dirty = True
        finally:
            self._gate.set()

    def nodes(self) -> frozenset[str]:
        return self._live

    # -- the API --------------------------------------------------------------------------
    async def client_online(self, client_id: str, node_id: str | None = None) -> str | None | InDoubt:
        self._own(node_id)
        self._registry.clients.add(client_id)
        reply = await self._write("online", client_id)
        if isinstance(reply, FallbackReason) or reply[0] == "doubt" or self._local_doubt() is not None:
            return IN_DOUBT
        return reply[1] or None

    async def client_offline(self, client_id: str, node_id: str | None = None) -> None:
        self._own(node_id)
        self._registry.clients.discard(client_id)
        await self._write("offline", client_id)

    async def where_is(self, client_id: str) -> str | None | InDoubt:
        answer = await self._read("where", client_id)
        return IN_DOUBT if isinstance(answer, FallbackReason) else (answer[0] or None)

    async def add_interest(self, queue: str, node_id: str | None = None) -> bool:
        self._own(node_id)
        if not self._registry.add_interest(queue):
            return not self._dirty
        return not isinstance(await self._write("interest", queue, 1), FallbackReason)

    async def remove_interest(self, queue: str, node_id: str | None = None) -> None:
        self._own(node_id)
        if self._registry.remove_interest(queue):
            await self._write("interest", queue, 0)

    async def nodes_for(self, queue: str) -> frozenset[str] | None:
        answer = await self._read("nodes_for", queue)
        return None if isinstance(answer, FallbackReason) else frozenset(answer)

    async def clients(self, prefix: str = "", limit: int = 100) -> ClientList:
        pattern = prefix.translate(_GLOB_SPECIAL) + "*"
        try:
            async with asyncio.timeout(self.options.list_deadline_s):
                pairs = [(c, n) async for c, n in self._redis.hscan_iter(self.prefix + "clients", match=pattern,
                                                                         count=1000)]
                holders = sorted({n for _, n in pairs})
                alive = dict(zip(holders, await self._redis.mget([self.prefix + "node:" + n for n in holders])
                                 if holders else [], strict=True))
                status = await self._script("nodes", self._gen)
        except (RedisError, OSError, TimeoutError):
            _raise_lost_cancel()
            return ClientList([], False)
        _raise_lost_cancel()
        complete = not isinstance(status, FallbackReason) and status[0] == "ok" and self._local_doubt() is None
        return ClientList(smallest(((c, n) for c, n in pairs if alive.get(n) is not None), limit), complete)

    def _own(self, node_id: str | None) -> None:
        if node_id is not None and node_id != self.node_id:
            raise ValueError(f"lookup of node {self.node_id!r} cannot register connections of {node_id!r}")

    # -- calls ----------------------------------------------------------------------------
    def _local_doubt(self) -> FallbackReason | None:
        if self._down:
            return FallbackReason.UNREACHABLE
        now = _now()
        if now < self._settle_until or (self._expect and now < self._expect_until):
            return FallbackReason.SETTLING
        if self._dirty or not self._gen:
            return FallbackReason.UNSYNCED
        return None

    async def _read(self, name: str, key: str) -> list[str] | FallbackReason:
        self.stats.lookups += 1
        reason = self._local_doubt()
        if reason is None:
            reply = await self._script(name, self._gen, key)
            if isinstance(reply, FallbackReason):
                reason = reply
            elif reply[0] == "doubt":
                reason = FallbackReason(reply[1])
            else:
                return reply[1:]
        self.stats.fallback(reason)
        return reason

    async def _write(self, name: str, *args: Any) -> list[str] | FallbackReason:
        # during a re-registration writes wait (each of its steps is bounded by the deadline):
        # one landing between its snapshot and a later chunk could be undone by that chunk
        await self._gate.wait()
        reply = await self._script(name, self._gen, self.node_id, *args)
        if isinstance(reply, FallbackReason):
            # Redis may or may not have it: re-register at the next heartbeat, announced at once
            self._dirty = True
            self.stats.write_failures += 1
            self._heartbeat_soon()
        return reply

    def _heartbeat_soon(self) -> None:
        if not self._closed and (self._kick is None or self._kick.done()) and not self._beat.locked():
            self._kick = asyncio.create_task(self.heartbeat())

    async def _script(self, name: str, *args: Any) -> Any:
        """Run one script; a FallbackReason instead of raising when Redis fails or is slow."""
        try:
            async with asyncio.timeout(self.options.deadline_s):
                reply = await self._scripts[name](args=(self.prefix, *args))
        except (TimeoutError, RedisTimeoutError):
            reply = FallbackReason.DEADLINE
        except (RedisError, OSError) as exc:
            if not isinstance(exc, (RedisConnectionError, OSError)):
                log.warning("lookup redis error node=%s script=%s error=%s", self.node_id, name, exc)
            reply = FallbackReason.UNREACHABLE
        _raise_lost_cancel()
        return reply


def _raise_lost_cancel() -> None:
    """Python 3.11's asyncio.wait_for, which redis-py uses, can return a result and drop a
    cancellation that arrived with it (fixed in 3.12); the caller's task must still end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
