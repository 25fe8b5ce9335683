"""The gRPC listener: grpcio's asyncio server with the ``MessagingService`` on a plain port,
a TLS one (the server's certificate chain and key), or both, also reached through the
remoting port (shared_port.py) when asked. On stop, long polls end at once, empty, and the
server says GOAWAY: new calls are refused, those under way get a grace period to finish."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol.service_pb2_grpc import add_MessagingServiceServicer_to_server

from ..pressure import StorePressure
from ..remoting.broker import RemotingBroker
from .renewals import Renewals
from .service import MessagingService
from .shared_port import SharedPort

STOP_GRACE_S = 2.0


@dataclass(slots=True, frozen=True)
class GrpcBind:
    host: str
    port: int  # 0: any free one
    advertised_host: str  # what routes name
    key_and_chain: tuple[bytes, bytes] | None = None  # PEM: a TLS port's private key and certificate chain


class GrpcServer:
    def __init__(self, broker: RemotingBroker, pressure: StorePressure | None = None, *,
                 fifo_groups: frozenset[str] = frozenset()) -> None:
        self.broker = broker
        self.pressure = pressure
        self.fifo_groups = fifo_groups
        self.server: grpc.aio.Server | None = None
        self.service: MessagingService | None = None
        self.address: tuple[str, int] = ("", 0)  # the plain port, as routes name it
        self.tls_address: tuple[str, int] = ("", 0)  # the TLS port, as routes name it
        self._targets: dict[bool, tuple[str, int]] = {}  # TLS or not -> where this host reaches the port
        self.shared: SharedPort | None = None  # gRPC on the remoting port

    async def start(self, plain: GrpcBind | None, tls: GrpcBind | None) -> None:
        self.server = grpc.aio.server()
        if plain is not None:
            self.address = (plain.advertised_host, self._listen(plain, "grpc_bind"))
        if tls is not None:
            self.tls_address = (tls.advertised_host, self._listen(tls, "grpcs_bind"))
        self.service = MessagingService(self.broker, self.address, self.pressure, fifo_groups=self.fifo_groups,
                                        renewals=Renewals(self.broker.pop))
        self.service.tls_advertised = self.tls_address
        add_MessagingServiceServicer_to_server(self.service, self.server)
        await self.server.start()
        self.service.renewals.start()

    def _listen(self, bind: GrpcBind, name: str) -> int:
        assert self.server is not None
        address = f"[{bind.host}]:{bind.port}" if ":" in bind.host else f"{bind.host}:{bind.port}"
        if bind.key_and_chain is None:
            bound = self.server.add_insecure_port(address)
        else:
            bound = self.server.add_secure_port(address, grpc.ssl_server_credentials([bind.key_and_chain]))
        if bound == 0:
            raise OSError(f"{name}: cannot listen on {address}")
        host = bind.host
        loopback = "127.0.0.1" if host in ("0.0.0.0", "localhost", "") else "::1" if host == "::" else host
        self._targets[bind.key_and_chain is not None] = (loopback, bound)
        return bound

    def share_port(self, remoting_advertised: tuple[str, int]) -> SharedPort:
        """What forwards the gRPC connections of the remoting port here (plain and TLS alike:
        bytes); routes given over it name ``remoting_advertised``."""
        assert self.service is not None
        self.shared = SharedPort(self._targets.get(False), self._targets.get(True))
        self.service.access.forwarded = self.shared.peers
        self.service.shared_advertised = remoting_advertised
        return self.shared

    async def stop(self) -> None:
        if self.shared is not None:
            await self.shared.stop()
        if self.service is not None:
            self.service.drain()
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
            self.server = None
        if self.service is not None:
            await self.service.renewals.stop()
