"""What a relay of one remoting client connection remembers to carry it across a change of
server, and the answers it rewrites (sans-IO).

The relay forwards whole commands. It keeps the client's requests in flight (by opaque) and its
last HEART_BEAT. When the server is lost, ``lost`` says which requests in flight are sent
again to the next server (those that only read, or set a value again, and sends the relay
numbered: the store answers a number it has written as the first time) and answers the others
SERVICE_NOT_AVAILABLE, which clients retry; ``resend`` starts with what to say first there.
Route and cluster answers are rewritten to name the relay's own address, and so are the store
host of the messages answers carry and the offsetMsgIds of send answers (clients look a message
up by id at the address in it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .codes import RequestCode, ResponseCode
from .errors import RemotingProtocolError
from .frames import RemotingCommand, response_to
from .message_codec import with_msg_id_host, with_store_host

# sent again to the next server when the first was lost with them in flight: they read, or set
# what they set again (an offset, a lock, a registration), so doing them twice changes nothing
RESENDABLE = frozenset((
    RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RequestCode.PULL_MESSAGE, RequestCode.QUERY_CONSUMER_OFFSET,
    RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.HEART_BEAT,
    RequestCode.UNREGISTER_CLIENT, RequestCode.CHECK_CLIENT_CONFIG, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    RequestCode.QUERY_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.LOCK_BATCH_MQ,
    RequestCode.UNLOCK_BATCH_MQ,
))
ROUTE_ANSWERS = frozenset((RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO))
SEND_ANSWERS = frozenset((RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE))
MESSAGE_ANSWERS = frozenset((RequestCode.PULL_MESSAGE, RequestCode.POP_MESSAGE, RequestCode.QUERY_MESSAGE,
                             RequestCode.VIEW_MESSAGE_BY_ID))
# a send's number, added by a relay (the server takes these from a trusted connection only, and
# before it checks the client's signature, which does not cover them)
RELAY_PRODUCER = "tidemqRelayProducer"
RELAY_SEQ = "tidemqRelaySeq"
LOST_REMARK = ("the store leader was lost with this request in flight (it may have been done): send it again; "
               "a store failover is under way")
NO_LEADER_REMARK = "no store leader yet: a store failover is under way, send it again"


class RelayMemory:
    """One client connection's relay state. ``advertised``: the HOST:PORT route answers name;
    ``store_host``: the (4-byte address, port) message ids name; ``refused_codes``: request
    codes never relayed (the server's private ones)."""

    def __init__(self, advertised: str, store_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0),
                 refused_codes: Iterable[int] = (), *, producer: str = "",
                 hello: RemotingCommand | None = None) -> None:
        self.advertised = advertised
        self.store_host = store_host
        self.producer = producer  # this relay's id for numbering sends ("": not numbered)
        self.hello = hello  # said first on each server connection (its answer is the relay's)
        self._seq = 0
        self.refused_codes = frozenset(refused_codes)
        self.in_flight: dict[int, RemotingCommand] = {}  # the client's requests the server owes an answer
        self.heartbeat: RemotingCommand | None = None  # the client's last
        self._greetings: set[int] = set()  # opaques of our own heartbeats (their answers are ours)
        self._next_own = -1  # (negative: clients count their opaques up from 0)

    def refusal(self, request: RemotingCommand) -> RemotingCommand | None:
        """The answer to a request that is not relayed (None: relay it)."""
        if request.code in self.refused_codes:
            return response_to(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                               f"request code {request.code} is not supported by TideMQ")
        return None

    def sent(self, request: RemotingCommand) -> None:
        """``request`` is written to the server now."""
        if request.code == RequestCode.HEART_BEAT:
            self.heartbeat = request
        if not request.is_oneway:
            if self.producer and request.code in SEND_ANSWERS:
                self._seq += 1
                request.ext_fields[RELAY_PRODUCER] = self.producer
                request.ext_fields[RELAY_SEQ] = str(self._seq)
            self.in_flight[request.opaque] = request

    def answer(self, command: RemotingCommand) -> RemotingCommand | None:
        """A response from the server, as the client gets it (None: not the client's)."""
        if command.opaque in self._greetings:
            self._greetings.discard(command.opaque)
            return None
        request = self.in_flight.pop(command.opaque, None)
        if request is None or command.code != ResponseCode.SUCCESS:
            return command
        code = request.code
        try:
            if code in ROUTE_ANSWERS:
                command.body = json.dumps(self._named_here(code, json.loads(command.body))).encode()
            elif code in MESSAGE_ANSWERS and command.body:
                command.body = with_store_host(command.body, *self.store_host)
            elif code in SEND_ANSWERS and command.ext_fields.get("msgId"):
                command.ext_fields["msgId"] = ",".join(with_msg_id_host(one, *self.store_host)
                                                       for one in command.ext_fields["msgId"].split(","))
        except (ValueError, TypeError, AttributeError, KeyError, RemotingProtocolError) as exc:
            # (passed on, it would send the client to the store node behind this relay)
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"the store node's answer is not readable "
                               f"here: {exc}")
        return command

    def _named_here(self, code: int, data: dict[str, Any]) -> dict[str, Any]:
        brokers = data["brokerDatas"] if code == RequestCode.GET_ROUTEINFO_BY_TOPIC \
            else list(data["brokerAddrTable"].values())
        for broker in brokers:
            broker["brokerAddrs"] = {key: self.advertised for key in broker["brokerAddrs"]}
        return data

    def lost(self) -> list[RemotingCommand]:
        """The server is lost: the answers for the requests in flight that are not sent again
        (``resend`` gives the others)."""
        self._greetings.clear()
        answers = []
        for opaque, request in list(self.in_flight.items()):
            if request.code not in RESENDABLE and RELAY_SEQ not in request.ext_fields:
                del self.in_flight[opaque]
                answers.append(response_to(request, ResponseCode.SERVICE_NOT_AVAILABLE, LOST_REMARK))
        return answers

    def resend(self) -> list[RemotingCommand]:
        """What to write first to a new server: the relay's hello and the client's last
        heartbeat (their answers kept from the client), then its requests in flight, in the
        order it sent them."""
        first = []
        if self.hello is not None:
            hello = RemotingCommand(self.hello.code, self._next_own, 0, dict(self.hello.ext_fields))
            self._greetings.add(self._next_own)
            self._next_own -= 1
            first.append(hello)
        if self.heartbeat is not None and not any(r.code == RequestCode.HEART_BEAT for r in self.in_flight.values()):
            greeting = RemotingCommand(self.heartbeat.code, self._next_own, self.heartbeat.flag,
                                       dict(self.heartbeat.ext_fields), self.heartbeat.body,
                                       remark=self.heartbeat.remark, language=self.heartbeat.language,
                                       version=self.heartbeat.version,
                                       serialize_type=self.heartbeat.serialize_type)
            self._greetings.add(self._next_own)
            self._next_own -= 1
            first.append(greeting)
        return first + list(self.in_flight.values())

    @staticmethod
    def not_linked(request: RemotingCommand) -> RemotingCommand | None:
        """The answer to a request that came while there is no server (None: one-way, dropped)."""
        return None if request.is_oneway else response_to(request, ResponseCode.SERVICE_NOT_AVAILABLE,
                                                          NO_LEADER_REMARK)
