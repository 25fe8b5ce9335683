"""A gateway node's listeners for the protocols it passes on to the store leader rather than
serving from a store of its own: AMQP (relay.py), RocketMQ remoting (remoting_relay.py) and
RocketMQ 5 gRPC (grpc_proxy.py). Each follows the leader through a failover
(``GatewayStore.after_relink``); the remoting and gRPC ones count what a failover did to
requests under way (metrics)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from protocols.remoting.frames import RemotingCommand

from ..config import Config, ConfigError
from ..listen import ListeningServer, format_address
from .failover_counts import FailoverCounts
from .gateway_store import GatewayStore
from .relay import start_relay
from .remoting_relay import RemotingRelay, start_remoting_relay
from .store_link import StoreCode

if TYPE_CHECKING:
    from .grpc_proxy import GrpcProxy

log = logging.getLogger("tidemq.cluster")

StoreAddress = Callable[[str], Awaitable[tuple[str, int]]]  # a service ("amqp", "remoting", "grpc") -> host, port


class RelayedListeners:
    def __init__(self, config: Config, store: GatewayStore, store_address: StoreAddress, *, follows_leader: bool,
                 remoting_advertised: Callable[[str, int], str], grpc_advertised: Callable[[str], str]) -> None:
        self.config = config
        self.store = store
        self._store_address = store_address
        self._follows_leader = follows_leader  # a replicated group's (else one store node's listeners, known now)
        self._remoting_advertised = remoting_advertised
        self._grpc_advertised = grpc_advertised
        self.remoting: RemotingRelay | None = None
        self.grpc_proxy: GrpcProxy | None = None

    async def start_amqp(self, bind: tuple[str, int]) -> ListeningServer:
        """AMQP connections relayed to the store node's listener (relay.py)."""
        if not self._follows_leader and not self.store.remote.amqp_port:
            raise ConfigError("amqp_bind: the store node has no AMQP listener to relay to")
        server, relay = await start_relay(bind[0], bind[1], lambda: self._store_address("amqp"),
                                          failover_s=self.store.failover_s)
        self.store.after_relink.append(relay.leader_moved)
        return server

    async def start_remoting(self, bind: tuple[str, int]) -> ListeningServer:
        """Remoting connections relayed to the store node's (remoting_relay.py), route answers
        naming this node."""
        cfg = self.config
        server, relay = await start_remoting_relay(
            bind[0], bind[1], lambda: self._store_address("remoting"), advertise=self._remoting_advertised,
            refused_codes=StoreCode, failover_s=self.store.failover_s, max_frame_size=cfg.remoting_max_frame_size,
            connect_timeout_s=cfg.connect_timeout_s, idle_timeout_s=cfg.remoting_idle_timeout_s,
            hello=RemotingCommand(StoreCode.HELLO, ext_fields={"token": cfg.cluster_token} if cfg.cluster_token else {}))
        self.store.after_relink.append(relay.leader_moved)
        self.remoting = relay
        return server

    async def start_grpc(self, bind: tuple[str, int]) -> None:
        """gRPC calls proxied to the store node's listener (grpc_proxy.py)."""
        from .grpc_proxy import GrpcProxy  # (grpcio and the generated modules: only when asked for)
        if not self._follows_leader and not self.store.remote.grpc_port:
            raise ConfigError("grpc_bind: the store node has no gRPC listener (grpc_bind) to proxy to")
        self.grpc_proxy = GrpcProxy(lambda: self._store_address("grpc"))
        address = await self.grpc_proxy.start(bind[0], bind[1], self._grpc_advertised(bind[0]))
        self.store.after_relink.append(self.grpc_proxy.leader_moved)
        log.info("listener started protocol=grpc address=%s", format_address(*address))

    def counts(self) -> dict[str, FailoverCounts]:
        """The RocketMQ relays' failover counts, by protocol (metrics)."""
        counts = {}
        if self.remoting is not None:
            counts["remoting"] = self.remoting.counts
        if self.grpc_proxy is not None:
            counts["grpc"] = self.grpc_proxy.counts
        return counts

    async def close(self) -> None:
        if self.remoting is not None:
            await self.remoting.close()
            self.remoting = None
        if self.grpc_proxy is not None:
            await self.grpc_proxy.stop()
            self.grpc_proxy = None
