"""The gRPC listener: grpcio's asyncio server with the ``MessagingService``, also reached
through the remoting port (shared_port.py) when asked. On stop, long
polls end at once, empty, and the server says GOAWAY: new calls are refused, those under way
get a grace period to finish."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol.service_pb2_grpc import add_MessagingServiceServicer_to_server

from ..pressure import StorePressure
from ..remoting.broker import RemotingBroker
from .renewals import Renewals
from .service import MessagingService
from .shared_port import SharedPort

STOP_GRACE_S = 2.0


class GrpcServer:
    def __init__(self, broker: RemotingBroker, pressure: StorePressure | None = None, *,
                 fifo_groups: frozenset[str] = frozenset()) -> None:
        self.broker = broker
        self.pressure = pressure
        self.fifo_groups = fifo_groups
        self.server: grpc.aio.Server | None = None
        self.service: MessagingService | None = None
        self.address: tuple[str, int] = ("", 0)  # as routes name it
        self.bind_host, self.bound_port = "", 0
        self.shared: SharedPort | None = None  # gRPC on the remoting port

    async def start(self, host: str, port: int, advertised_host: str) -> tuple[str, int]:
        """Listen on HOST:PORT (port 0: any free one); routes name ``advertised_host`` and the port."""
        self.server = grpc.aio.server()
        bound = self.server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if bound == 0:
            raise OSError(f"grpc_bind: cannot listen on {host}:{port}")
        self.address = (advertised_host, bound)
        self.bind_host, self.bound_port = host, bound
        self.service = MessagingService(self.broker, self.address, self.pressure, fifo_groups=self.fifo_groups,
                                        renewals=Renewals(self.broker.pop))
        add_MessagingServiceServicer_to_server(self.service, self.server)
        await self.server.start()
        self.service.renewals.start()
        return self.address

    def share_port(self, remoting_advertised: tuple[str, int]) -> SharedPort:
        """What forwards the gRPC connections of the remoting port here; routes given over it
        name ``remoting_advertised``."""
        assert self.service is not None
        host = self.bind_host
        target = "127.0.0.1" if host in ("0.0.0.0", "localhost", "") else "::1" if host == "::" else host
        self.shared = SharedPort((target, self.bound_port))
        self.service.access.forwarded = self.shared.peers
        self.service.shared_advertised = remoting_advertised
        return self.shared

    async def stop(self) -> None:
        if self.shared is not None:
            await self.shared.stop()
        if self.service is not None:
            self.service.draining.set()
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
            self.server = None
        if self.service is not None:
            await self.service.renewals.stop()
