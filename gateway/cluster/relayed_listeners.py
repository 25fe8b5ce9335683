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
from protocols.rocketmq_grpc.proxy_rules import endpoints_of

from ..config import Config, ConfigError
from ..listen import ListeningServer, format_address
from ..tls import key_and_chain
from .failover_counts import FailoverCounts
from .gateway_store import GatewayStore
from .relay import start_relay
from .remoting_relay import RemotingRelay, start_remoting_relay
from .store_link import StoreCode

if TYPE_CHECKING:
    from ..rocketmq_grpc.shared_port import SharedPort
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
        self.shared: SharedPort | None = None  # the remoting port's gRPC connections, forwarded to the proxy

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

    async def start_grpc(self, plain: tuple[str, int] | None, tls: tuple[str, int] | None) -> None:
        """gRPC calls (plain, TLS or both) proxied to the store node's plain listener
        (grpc_proxy.py); and the remoting port's gRPC connections, when it takes them."""
        from ..rocketmq_grpc.shared_port import SharedPort  # (grpcio and the generated modules: only when asked for)
        from .grpc_proxy import GrpcProxy
        cfg = self.config
        if not self._follows_leader and not self.store.remote.grpc_port:
            name = "grpc_bind" if plain is not None else "grpcs_bind"
            raise ConfigError(f"{name}: the store node has no gRPC listener (grpc_bind) to proxy to")
        proxy = self.grpc_proxy = GrpcProxy(lambda: self._store_address("grpc"))
        started = await proxy.start(plain and (plain[0], plain[1], self._grpc_advertised(plain[0])),
                                    tls and (tls[0], tls[1], self._grpc_advertised(tls[0])),
                                    key_and_chain(cfg) if tls is not None else None)
        self.store.after_relink.append(proxy.leader_moved)
        for name, host, bound in started:
            log.info("listener started protocol=%s address=%s", name, format_address(host, bound))
        if cfg.grpc_on_remoting_port and self.remoting is not None:  # (it sniffs HTTP/2's preface, TLS handshakes)
            shared = SharedPort(proxy.targets.get(False), proxy.targets.get(True))
            proxy.forwarded = shared.peers
            host, _, port = self.remoting.advertised.rpartition(":")
            proxy.shared_endpoints = endpoints_of(host.strip("[]"), int(port))
            self.remoting.http2_handoff = shared.hand_over
            self.shared = shared
            log.info("grpc also on the remoting port address=%s", self.remoting.advertised)

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
        if self.shared is not None:
            await self.shared.stop()
            self.shared = None
        if self.grpc_proxy is not None:
            await self.grpc_proxy.stop()
            self.grpc_proxy = None
