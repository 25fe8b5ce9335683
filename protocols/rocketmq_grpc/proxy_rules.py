"""How a proxy of ``MessagingService`` calls (a gateway node's, in front of the store leader)
treats each call: which may be sent again to a new leader after the first was lost, and the
answers rewritten to name the proxy's own endpoints instead of the server's (sans-IO)."""

from __future__ import annotations

from collections.abc import Callable

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
PREFIX = f"/{SERVICE.full_name}/"

# they read, or say again what they said (a heartbeat, an offset), or the server answers them
# again as the first time (a send, by its message id): done twice, nothing changes
RESENDABLE = frozenset(PREFIX + name for name in (
    "QueryRoute", "Heartbeat", "QueryAssignment", "NotifyClientTermination", "GetOffset", "QueryOffset",
    "UpdateOffset", "SendMessage"))


def method_kinds() -> dict[str, tuple[bool, bool]]:
    """Each method's path -> (client streaming, server streaming)."""
    return {PREFIX + method.name: (method.client_streaming, method.server_streaming) for method in SERVICE.methods}


def endpoints_of(host: str, port: int) -> pb.Endpoints:
    return pb.Endpoints(scheme=pb.IPv6 if ":" in host else pb.IPv4, addresses=[pb.Address(host=host, port=port)])


def _route(raw: bytes, endpoints: pb.Endpoints) -> bytes:
    response = rpc.QueryRouteResponse.FromString(raw)
    for queue in response.message_queues:
        queue.broker.endpoints.CopyFrom(endpoints)
    return response.SerializeToString()


def _assignment(raw: bytes, endpoints: pb.Endpoints) -> bytes:
    response = rpc.QueryAssignmentResponse.FromString(raw)
    for assignment in response.assignments:
        assignment.message_queue.broker.endpoints.CopyFrom(endpoints)
    return response.SerializeToString()


REWRITTEN: dict[str, Callable[[bytes, pb.Endpoints], bytes]] = {
    PREFIX + "QueryRoute": _route, PREFIX + "QueryAssignment": _assignment}


def named_here(method: str, raw: bytes, endpoints: pb.Endpoints) -> bytes:
    """The server's answer to ``method``, naming ``endpoints`` as the broker's (raises
    google.protobuf's DecodeError for an answer that does not decode)."""
    rewrite = REWRITTEN.get(method)
    return raw if rewrite is None else rewrite(raw, endpoints)
