"""Who a gRPC call comes from, and what it may do: the call's AccessKey signature checked
against the remoting side's access keys, and its topic against the same ACL, by the remoting
side's rules (gateway/remoting/access.py) -- UNAUTHORIZED for a signature refused, FORBIDDEN
for a topic denied."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.rocketmq_grpc.authorization import AuthorizationError, parse_authorization
from protocols.rocketmq_grpc.messages import GrpcRequestError

from ..auth.access_keys import AccessKeys
from ..auth.authorize import Principal
from ..remoting.access import RemotingAccess, Right, Unauthenticated
from ..remoting.requests import BadRequest
from .codes import grpc_code_of_remoting


class GrpcAccess:
    def __init__(self, access: RemotingAccess) -> None:
        self.access = access
        # connections forwarded from the remoting port (shared_port.py): gRPC's peer -> the client's
        self.forwarded: dict[str, str] = {}

    def peer(self, context: grpc.aio.ServicerContext) -> str:
        """The client's address (not the forward's, for a call that came over the remoting port)."""
        peer = context.peer()
        return self.forwarded.get(peer, peer)

    def principal(self, context: grpc.aio.ServicerContext, call: str) -> Principal:
        """Who signed the call; GrpcRequestError (UNAUTHORIZED) when the signature is refused."""
        try:
            signed, malformed = parse_authorization(call_metadata(context)), ""
        except AuthorizationError as exc:
            signed, malformed = None, str(exc)
        # (the clients sign with an empty Credential when they have no AccessKey: unsigned;
        # a malformed signature is refused, never taken for none)
        access_key = (signed.access_key or None) if signed is not None else ("" if malformed else None)

        def verify(keys: AccessKeys) -> tuple[str | None, str]:
            if signed is None:
                return None, malformed
            return keys.verify_date(signed.access_key, signed.date_time, signed.signature)
        try:
            return self.access.identify("grpc", self.peer(context), access_key, verify, call)
        except Unauthenticated as exc:
            raise GrpcRequestError(pb.UNAUTHORIZED, str(exc)) from None

    def check_topic(self, who: Principal, topic: str, right: Right, call: str) -> None:
        """GrpcRequestError (FORBIDDEN) when ``who`` may not use ``topic`` as ``right`` says."""
        try:
            self.access.check_topic(who, topic, right, call)
        except BadRequest as exc:
            raise GrpcRequestError(grpc_code_of_remoting(exc.code), str(exc)) from None


def call_metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """A call's text metadata by (lower-case) key."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
