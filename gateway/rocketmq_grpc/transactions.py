"""EndTransaction of RocketMQ 5's transactional producers: the half message its transaction id
names committed or rolled back by the remoting side's transaction service (one for both
protocols: gateway/remoting/transactions.py), for the producer that may write it."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from protocols.remoting.properties import PGROUP, UNIQ_KEY
from protocols.rocketmq_grpc.messages import GrpcRequestError
from protocols.rocketmq_grpc.receipts import decode_transaction_id
from store import StoredMessage

from ..auth.authorize import Principal
from ..remoting.broker import RemotingBroker
from ..remoting.requests import BadRequest
from ..remoting.transactions import TransactionNotFound
from .codes import grpc_code_of_remoting

_COMMIT = {pb.COMMIT: True, pb.ROLLBACK: False}


async def end(broker: RemotingBroker, who: Principal, request: rpc.EndTransactionRequest) -> None:
    """Raises GrpcRequestError: INVALID_TRANSACTION_ID for a transaction id not of a half
    message of this topic and message id waiting, FORBIDDEN for a producer that may not write it."""
    commit = _COMMIT.get(request.resolution)
    if commit is None:
        raise GrpcRequestError(pb.BAD_REQUEST, "the resolution is neither COMMIT nor ROLLBACK")
    position = decode_transaction_id(request.transaction_id)
    if position is None:
        raise GrpcRequestError(pb.INVALID_TRANSACTION_ID, "not a transaction id of this gateway")

    def ours(message: StoredMessage) -> bool:
        properties = message.properties
        return properties.get(PGROUP) == request.topic.name and properties.get(UNIQ_KEY) == request.message_id
    try:
        await broker.transactions.finish(who, position, commit, ours)
    except TransactionNotFound:
        raise GrpcRequestError(pb.INVALID_TRANSACTION_ID, "no half message of this topic and message id waits "
                                                          "under this transaction id (ended already?)") from None
    except BadRequest as exc:
        raise GrpcRequestError(grpc_code_of_remoting(exc.code), str(exc)) from None
