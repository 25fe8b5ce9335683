"""The rules a gateway node's RocketMQ relays follow at a store failover and in route answers,
without a network: protocols/remoting/relay_memory.py and protocols/rocketmq_grpc/proxy_rules.py;
and their shared lookup of the leader (gateway/cluster/leader_lookup.py)."""

from __future__ import annotations

import asyncio
import json

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from gateway.cluster.leader_lookup import LeaderLookup
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY, RemotingCommand, response_to
from protocols.remoting.relay_memory import RELAY_PRODUCER, RELAY_SEQ, RelayMemory
from protocols.rocketmq_grpc.proxy_rules import PREFIX, RESENDABLE, endpoints_of, method_kinds, named_here

HERE = "10.0.0.7:9876"


def request(code: int, opaque: int, flag: int = 0) -> RemotingCommand:
    return RemotingCommand(code, opaque, flag, {"topic": "t"})


def test_a_loss_answers_changes_in_flight_and_keeps_reads_to_send_again() -> None:
    memory = RelayMemory(HERE)
    for command in (request(RequestCode.HEART_BEAT, 1), request(RequestCode.SEND_MESSAGE, 2),
                    request(RequestCode.PULL_MESSAGE, 3), request(RequestCode.POP_MESSAGE, 4),
                    request(RequestCode.UPDATE_CONSUMER_OFFSET, 5, FLAG_ONEWAY)):
        memory.sent(command)
    assert memory.answer(response_to(request(RequestCode.HEART_BEAT, 1), ResponseCode.SUCCESS)) is not None
    answers = memory.lost()
    assert [(a.opaque, a.code) for a in answers] == [(2, ResponseCode.SERVICE_NOT_AVAILABLE),
                                                     (4, ResponseCode.SERVICE_NOT_AVAILABLE)]
    again = memory.resend()
    assert [(c.code, c.opaque < 0) for c in again] == [(RequestCode.HEART_BEAT, True),
                                                       (RequestCode.PULL_MESSAGE, False)]
    # the relay's own heartbeat's answer is not the client's; the pull's is
    assert memory.answer(response_to(again[0], ResponseCode.SUCCESS)) is None
    assert memory.answer(response_to(again[1], ResponseCode.PULL_NOT_FOUND)).opaque == 3
    assert RelayMemory.not_linked(request(RequestCode.SEND_MESSAGE, 9)).code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert RelayMemory.not_linked(request(RequestCode.UPDATE_CONSUMER_OFFSET, 9, FLAG_ONEWAY)) is None


def test_route_and_cluster_answers_name_the_relay_and_an_unreadable_one_is_refused() -> None:
    memory = RelayMemory(HERE, (b"\x0a\x00\x00\x07", 9876), refused_codes=(30_100,))
    route = {"brokerDatas": [{"brokerName": "tidemq", "brokerAddrs": {"0": "10.0.0.1:9876"}}], "queueDatas": []}
    memory.sent(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1))
    answer = memory.answer(response_to(request(0, 1), ResponseCode.SUCCESS, body=json.dumps(route).encode()))
    assert json.loads(answer.body)["brokerDatas"][0]["brokerAddrs"] == {"0": HERE}
    cluster = {"brokerAddrTable": {"tidemq": {"brokerAddrs": {"0": "10.0.0.1:9876"}}}, "clusterAddrTable": {}}
    memory.sent(request(RequestCode.GET_BROKER_CLUSTER_INFO, 2))
    answer = memory.answer(response_to(request(0, 2), ResponseCode.SUCCESS, body=json.dumps(cluster).encode()))
    assert json.loads(answer.body)["brokerAddrTable"]["tidemq"]["brokerAddrs"] == {"0": HERE}
    memory.sent(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 3))
    answer = memory.answer(response_to(request(0, 3), ResponseCode.SUCCESS, body=b"not json"))
    assert answer.code == ResponseCode.SYSTEM_ERROR and b"10.0.0.1" not in answer.body
    assert memory.refusal(request(30_100, 4)).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_grpc_routes_and_assignments_name_the_proxy() -> None:
    leader = endpoints_of("10.0.0.1", 8081)
    here = endpoints_of("10.0.0.7", 8081)
    queue = pb.MessageQueue(topic=pb.Resource(name="t"), id=0, broker=pb.Broker(name="tidemq", endpoints=leader))
    route = rpc.QueryRouteResponse(message_queues=[queue, queue]).SerializeToString()
    rewritten = rpc.QueryRouteResponse.FromString(named_here(PREFIX + "QueryRoute", route, here))
    assert [q.broker.endpoints for q in rewritten.message_queues] == [here, here]
    assignment = rpc.QueryAssignmentResponse(assignments=[pb.Assignment(message_queue=queue)]).SerializeToString()
    rewritten_assignment = rpc.QueryAssignmentResponse.FromString(named_here(PREFIX + "QueryAssignment", assignment,
                                                                             here))
    assert rewritten_assignment.assignments[0].message_queue.broker.endpoints == here
    send = rpc.SendMessageResponse().SerializeToString()
    assert named_here(PREFIX + "SendMessage", send, here) == send
    assert PREFIX + "SendMessage" in RESENDABLE and PREFIX + "QueryRoute" in RESENDABLE  # (sends: by message id)
    assert PREFIX + "AckMessage" not in RESENDABLE and PREFIX + "EndTransaction" not in RESENDABLE
    assert method_kinds()[PREFIX + "Telemetry"] == (True, True)


async def test_connections_asking_for_the_leader_together_share_one_lookup() -> None:
    calls = []

    async def target() -> tuple[str, int]:
        calls.append(1)
        await asyncio.sleep(0.05)
        if len(calls) == 2:
            raise OSError("no leader")
        return "10.0.0.1", len(calls)

    lookup = LeaderLookup(target)
    assert await asyncio.gather(*(lookup() for _ in range(10))) == [("10.0.0.1", 1)] * 10
    assert len(calls) == 1
    await asyncio.sleep(0.15)  # (past the moment an answer is kept: asked again)
    results = await asyncio.gather(*(lookup() for _ in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["no leader"] * 3 and len(calls) == 2


def test_a_relay_that_numbers_its_sends_sends_them_again_after_its_hello() -> None:
    hello = RemotingCommand(30_100, 0, 0, {"token": "T"})
    memory = RelayMemory(HERE, producer="relay-1", hello=hello)
    memory.sent(request(RequestCode.SEND_MESSAGE, 1))
    memory.sent(request(RequestCode.POP_MESSAGE, 2))
    memory.sent(request(RequestCode.SEND_MESSAGE, 3))
    assert [a.opaque for a in memory.lost()] == [2]  # (the pop: not numbered)
    again = memory.resend()
    assert [(c.code, c.ext_fields.get(RELAY_SEQ)) for c in again] == [
        (30_100, None), (RequestCode.SEND_MESSAGE, "1"), (RequestCode.SEND_MESSAGE, "2")]
    assert again[0].ext_fields == {"token": "T"} and again[1].ext_fields[RELAY_PRODUCER] == "relay-1"
    assert memory.answer(response_to(again[0], ResponseCode.SUCCESS)) is None  # (the relay's own)
