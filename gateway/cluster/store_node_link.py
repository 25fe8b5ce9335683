"""A gateway node's way to its store node: where the store node serves (the configured
``store_address``, or a replicated group's leader, found in etcd), and the first store link,
tried again while a group elects a new leader; and the lookup its gateway nodes share."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lookup.api import Lookup, LookupOptions
from lookup.embedded import EmbeddedLookup
from lookup.redis_backend import RedisLookup
from lookup.tcp import TcpTransport

from ..config import Config, ConfigError, parse_bind, parse_peers
from .election import LeaderFinder
from .gateway_store import GatewayStore
from .remote_store import RemoteStore, RemoteStoreError

log = logging.getLogger("tidemq.gateway")

StoreAddress = Callable[[str], Awaitable[tuple[str, int]]]  # a service ("remoting", "amqp", "grpc") -> host, port


FIRST_LEADER_WAIT_S = 60.0  # how long a starting gateway node waits for its group's leader


@dataclass
class StoreNodeLink:
    store: GatewayStore
    address: StoreAddress  # where the store node serves a service now
    leader_finder: LeaderFinder | None  # a replicated group's (closed by the caller)


async def link_to_store_node(cfg: Config) -> StoreNodeLink:
    """The gateway node's store link, started; ConfigError when the store node cannot be
    reached (a group's leader: not within FIRST_LEADER_WAIT_S or five leases, whichever is
    longer: the group's nodes may be starting too) or refuses this node."""
    node_id = cfg.node_name()
    linked: list[GatewayStore] = []  # (the configured address's AMQP port comes from the link)
    finder, address = _store_address(cfg, linked)

    async def connect() -> RemoteStore:
        return await RemoteStore.connect(*(await address("remoting")), name=node_id, token=cfg.cluster_token)

    # a replicated store's leader key may still name a leader that just died: look again
    # until a new one is elected (the lease runs out), then give up
    deadline = time.monotonic() + (max(cfg.replication_lease_s * 5, FIRST_LEADER_WAIT_S) if cfg.replication_group
                                   else 0)
    while True:
        try:
            remote = await connect()
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ConfigError(f"cannot reach the store node ({cfg.store_address or cfg.replication_group}): "
                                  f"{exc}") from None
            log.warning("store group leader unreachable, looking again error=%s", exc)
            await asyncio.sleep(0.2)
        except RemoteStoreError as exc:
            raise ConfigError(f"the store node refused this node: {exc}") from None
    leader = (lambda: finder.address("remoting", timeout_s=0.5)) if finder is not None else None
    store = GatewayStore(remote, connect, relink_s=0.1 if finder else 0.5, leader=leader)
    linked.append(store)
    await store.start(node_id)
    return StoreNodeLink(store, address, finder)


def _store_address(cfg: Config, linked: list[GatewayStore]) -> tuple[LeaderFinder | None, StoreAddress]:
    """The store node's address of a service ("remoting": the store link, or "amqp"): the
    configured store_address, or a replicated store's leader, from etcd."""
    if cfg.replication_group:
        etcd = parse_bind(cfg.etcd_endpoint, "etcd_endpoint")
        assert etcd is not None
        finder = LeaderFinder(etcd, cfg.replication_group)
        return finder, lambda service: finder.address(service, timeout_s=cfg.replication_lease_s * 5)
    fixed = parse_bind(cfg.store_address, "store_address")
    assert fixed is not None

    async def configured(service: str) -> tuple[str, int]:
        if service in ("amqp", "grpc"):
            port = getattr(linked[0].remote, f"{service}_port") if linked else 0
            if not port:
                raise OSError(f"the store node has no {service} listener to relay to")
            return fixed[0], port
        return fixed
    return None, configured


def lookup_options(cfg: Config) -> LookupOptions:
    beat = cfg.lookup_heartbeat_s
    return LookupOptions(heartbeat_s=beat, node_ttl_s=5 * beat, settle_s=2.5 * beat, deadline_s=min(0.25, beat))


async def start_lookup(cfg: Config, node_id: str) -> Lookup | None:
    """The lookup of the configured backend, started (None: none configured)."""
    lookup: Lookup
    if cfg.lookup_backend == "redis" and cfg.redis_url:
        lookup = RedisLookup(node_id, cfg.redis_url, lookup_options(cfg))
    elif cfg.lookup_backend == "embedded" and cfg.peers:
        host, port = parse_bind(cfg.lookup_bind, "lookup_bind")  # type: ignore[misc]  # (config requires it with peers)
        peers = {peer: address for peer, address in parse_peers(cfg.peers).items() if peer != node_id}
        lookup = EmbeddedLookup(node_id, TcpTransport(node_id, host, port, peers), lookup_options(cfg))
    else:
        log.info("no lookup: takeovers go to every gateway node node_id=%s", node_id)
        return None
    await lookup.start()
    log.info("lookup started backend=%s node_id=%s", cfg.lookup_backend, node_id)
    return lookup
