"""The lookup link, sans-IO: embedded lookup requests between gateway nodes as RocketMQ
remoting commands, so nodes talk over remoting (and a remoting listener can serve them beside
RocketMQ clients, through the same frame codec).

Private request codes, ``LookupCode`` 30,200-30,204: RocketMQ's own codes stay below 4,000 and
at 200,000+, and the store link (``gateway/cluster/store_link.py``) uses 30,100-30,112. The
header is JSON; the body is the request as a JSON object (the ``op`` is the code). A reply is a
SUCCESS response whose body is the answer as a JSON object; a request that cannot be served gets
SYSTEM_ERROR (or REQUEST_CODE_NOT_SUPPORTED) with a remark.

    HEARTBEAT 30200  {node, inc, view, synced: [node], dirty: [node]} -> the same, of the peer
    LEAVE     30201  {node, inc} -> {}
    BATCH     30202  {node, view, ops: [[op, ...]]} -> {results: [[status, value]]} | {doubt}
    GET       30203  {kind: client, key, view} -> {value} | {doubt}
    LIST      30204  {prefix, limit} -> {clients: [[client, node]], complete}
"""

from __future__ import annotations

import enum
import json
from typing import Any

from protocols.remoting.codes import ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import RemotingCommand, response_to


class LookupCode(enum.IntEnum):
    HEARTBEAT = 30_200
    LEAVE = 30_201
    BATCH = 30_202
    GET = 30_203
    LIST = 30_204


_CODES = {code.name.lower(): code for code in LookupCode}
_OPS = {code.value: code.name.lower() for code in LookupCode}


class LookupLinkError(RemotingProtocolError):
    """A lookup request or reply that does not decode, or a reply that reports an error."""


def is_lookup_request(command: RemotingCommand) -> bool:
    return not command.is_response and command.code in _OPS


def request_command(request: dict[str, Any], opaque: int) -> RemotingCommand:
    try:
        code = _CODES[request["op"]]
    except KeyError:
        raise ValueError(f"not a lookup request: {request.get('op')!r}") from None
    body = {k: v for k, v in request.items() if k != "op"}
    return RemotingCommand(code, opaque=opaque, body=_encode(body))


def decode_request(command: RemotingCommand) -> dict[str, Any]:
    op = _OPS.get(command.code)
    if op is None:
        raise LookupLinkError(f"request code {command.code} is not a lookup request")
    request = _decode(command.body)
    request["op"] = op
    return request


def reply_command(request: RemotingCommand, reply: dict[str, Any]) -> RemotingCommand:
    return response_to(request, ResponseCode.SUCCESS, body=_encode(reply))


def error_command(request: RemotingCommand, code: int, remark: str) -> RemotingCommand:
    return response_to(request, code, remark=remark)


def decode_reply(command: RemotingCommand) -> dict[str, Any]:
    if command.code != ResponseCode.SUCCESS:
        raise LookupLinkError(f"lookup request failed with code {command.code}: {command.remark}")
    return _decode(command.body)


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _decode(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise LookupLinkError(f"lookup body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise LookupLinkError("lookup body is not a JSON object")
    return payload
