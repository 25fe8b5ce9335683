"""A pop consumer at the frame level. No installable client speaks pop (PyPI's rocketmq 0.4.4
wraps the C++ client 2.x, which has no pop; ali-ons has no POP_MESSAGE), so this follows the
wire exchange of apache/rocketmq's Java client byte for byte:

- POP_MESSAGE: PullAPIWrapper.popAsync fills PopMessageRequestHeader (consumerGroup, topic,
  queueId, maxMsgNums, invisibleTime, pollTime, bornTime, initMode, expType, exp, order,
  bname; RemotingCommand.makeCustomHeaderToNet writes every non-null field as a string);
  MQClientAPIImpl.processPopResponse reads the PopMessageResponseHeader and the body
  (MessageDecoder.decodesBatch) and gives each message its extraInfo (PROPERTY_POP_CK) from
  startOffsetInfo / msgOffsetInfo with ExtraInfoUtil.buildExtraInfo.
- ACK_MESSAGE: DefaultMQPushConsumerImpl.ackAsync (AckMessageRequestHeader from the extraInfo).
- BATCH_ACK_MESSAGE: MQClientAPIImpl.batchAckMessageAsync (BatchAckMessageRequestBody, BatchAck's
  short JSON names, the BitSet as fastjson writes a byte[]: base64 of BitSet.toByteArray).
- CHANGE_MESSAGE_INVISIBLETIME: DefaultMQPushConsumerImpl.changePopInvisibleTimeAsync, and
  changeInvisibleTimeAsync's new extraInfo from the ChangeInvisibleTimeResponseHeader (which it
  decodes before it looks at the code: RemotingCommand.decodeCommandCustomHeader refuses a
  response without its @CFNotNull fields).
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import RemotingCommand
from protocols.remoting.message_codec import WireMessage, decode_messages

from .remoting_support import RawRemoting

BROKER = "tidemq"  # the broker name route data gives (RemotingBroker's default)


@dataclass
class Popped:
    message: WireMessage
    extra_info: str  # PROPERTY_POP_CK, as the client sets it

    @property
    def body(self) -> bytes:
        return self.message.body


def build_extra_info(ck_offset: int, pop_time: int, invisible: int, revive_qid: int, topic: str, broker: str,
                     queue_id: int, offset: int) -> str:
    retry = "1" if topic.startswith("%RETRY%") else "0"  # (ExtraInfoUtil.getRetry; V2 aside)
    return f"{ck_offset} {pop_time} {invisible} {revive_qid} {retry} {broker} {queue_id} {offset}"


class PopClient:
    def __init__(self, raw: RawRemoting, group: str) -> None:
        self.raw = raw
        self.group = group
        self.last: RemotingCommand | None = None

    @classmethod
    async def open(cls, addr: str, group: str) -> PopClient:
        return cls(await RawRemoting.open(addr), group)

    async def pop(self, topic: str, queue_id: int = 0, max_nums: int = 32, invisible_ms: int = 60_000,
                  poll_ms: int = 0, init_mode: int = 0, exp: str = "*", exp_type: str = "TAG",
                  **extra: str) -> list[Popped]:
        response = await self.request_pop(topic, queue_id, max_nums, invisible_ms, poll_ms, init_mode, exp, exp_type,
                                          extra)
        if response.code in (ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_FULL):
            assert {"popTime", "invisibleTime", "reviveQid", "restNum"} <= response.ext_fields.keys()
            return []
        assert response.code == ResponseCode.SUCCESS, (response.code, response.remark)
        return self.popped(response)

    async def request_pop(self, topic: str, queue_id: int = 0, max_nums: int = 32, invisible_ms: int = 60_000,
                          poll_ms: int = 0, init_mode: int = 0, exp: str = "*", exp_type: str = "TAG",
                          extra: dict[str, str] | None = None) -> RemotingCommand:
        """The POP_MESSAGE exchange; ``extra``: header fields to add or override (refusal tests)."""
        header = {"consumerGroup": self.group, "topic": topic, "queueId": str(queue_id), "maxMsgNums": str(max_nums),
                  "invisibleTime": str(invisible_ms), "pollTime": str(poll_ms),
                  "bornTime": str(int(time.time() * 1000) if poll_ms else 0), "initMode": str(init_mode),
                  "expType": exp_type, "exp": exp, "order": "false", "bname": BROKER, **(extra or {})}
        response = await self.raw.call(RequestCode.POP_MESSAGE, header, timeout_s=poll_ms / 1000 + 10)
        self.last = response
        return response

    def popped(self, response: RemotingCommand) -> list[Popped]:
        """processPopResponse for a SUCCESS: the messages, each with its extraInfo."""
        ext = response.ext_fields
        pop_time, invisible, revive_qid = int(ext["popTime"]), int(ext["invisibleTime"]), int(ext["reviveQid"])
        starts = {f"{k}@{q}": int(v) for k, q, v in (one.split(" ") for one in ext["startOffsetInfo"].split(";"))}
        offsets = {}
        for one in ext["msgOffsetInfo"].split(";"):
            k, q, values = one.split(" ")
            assert f"{k}@{q}" not in offsets  # (parseMsgOffsetInfo refuses duplicates)
            offsets[f"{k}@{q}"] = [int(v) for v in values.split(",")]
        messages = decode_messages(response.body, check_crc=True)
        order: dict[str, list[int]] = {}  # buildQueueOffsetSortedMap: offsets in body order, per key
        for m in messages:
            order.setdefault(f"{'1' if m.topic.startswith('%RETRY%') else '0'}@{m.queue_id}", []).append(m.queue_offset)
        out = []
        for m in messages:
            key = f"{'1' if m.topic.startswith('%RETRY%') else '0'}@{m.queue_id}"
            offset = offsets[key][order[key].index(m.queue_offset)]
            assert offset == m.queue_offset
            extra_info = build_extra_info(starts[key], pop_time, invisible, revive_qid, m.topic, BROKER, m.queue_id,
                                          offset)
            m.properties.setdefault("POP_CK", extra_info)
            m.properties.setdefault("1ST_POP_TIME", str(pop_time))
            out.append(Popped(m, extra_info))
        return out

    async def ack(self, topic: str, popped: Popped | str) -> RemotingCommand:
        extra = popped if isinstance(popped, str) else popped.extra_info
        parts = extra.split(" ")
        real_topic = f"%RETRY%{self.group}_{topic}" if parts[4] == "1" else topic  # (getRealTopic, V1)
        header = {"consumerGroup": self.group, "topic": real_topic, "queueId": parts[6], "extraInfo": extra,
                  "offset": parts[7], "bname": parts[5]}
        return await self.raw.call(RequestCode.ACK_MESSAGE, header)

    async def batch_ack(self, topic: str, popped: list[Popped]) -> RemotingCommand:
        acks: dict[str, dict] = {}
        bits: dict[str, int] = {}
        for p in popped:
            parts = p.extra_info.split(" ")
            key = f"{parts[4]}@{parts[6]}@{parts[0]}@{parts[1]}"
            acks.setdefault(key, {"c": self.group, "t": topic, "r": parts[4], "so": int(parts[0]), "q": int(parts[6]),
                                  "rq": int(parts[3]), "pt": int(parts[1]), "it": int(parts[2])})
            bits[key] = bits.get(key, 0) | 1 << (int(parts[7]) - int(parts[0]))
        for key, ack in acks.items():  # BitSet.toByteArray: little-endian, no trailing zero bytes
            value = bits[key]
            ack["b"] = base64.b64encode(value.to_bytes((value.bit_length() + 7) // 8, "little")).decode()
        body = {"acks": [dict(sorted(a.items())) for a in acks.values()], "brokerName": BROKER}
        return await self.raw.call(RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps(body, separators=(",", ":")).encode())

    async def change(self, topic: str, popped: Popped | str, invisible_ms: int) -> tuple[RemotingCommand, str | None]:
        """The response and, on success, the message's new extraInfo (as the client rebuilds it)."""
        extra = popped if isinstance(popped, str) else popped.extra_info
        parts = extra.split(" ")
        header = {"consumerGroup": self.group, "topic": topic, "queueId": parts[6], "extraInfo": extra,
                  "offset": parts[7], "invisibleTime": str(invisible_ms), "bname": parts[5]}
        response = await self.raw.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header)
        ext = response.ext_fields  # (decoded whatever the code: its @CFNotNull fields must be there)
        assert {"popTime", "invisibleTime", "reviveQid"} <= ext.keys(), (response.code, ext)
        if response.code != ResponseCode.SUCCESS:
            return response, None
        new = build_extra_info(int(parts[7]), int(ext["popTime"]), int(ext["invisibleTime"]), int(ext["reviveQid"]),
                               topic, parts[5], int(parts[6]), int(parts[7]))
        return response, new

    async def heartbeat(self, topic: str, client_id: str) -> RemotingCommand:
        """HEART_BEAT as MQClientInstance.sendHeartbeatToAllBroker sends it for a pop consumer
        of ``topic`` (HeartbeatData: clientID and its consumers' groups and subscriptions)."""
        consumer = {"groupName": self.group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
                    "subscriptionDataSet": [{"topic": topic, "subString": "*", "expressionType": "TAG",
                                             "tagsSet": [], "codeSet": [], "subVersion": int(time.time() * 1000)}]}
        body = json.dumps({"clientID": client_id, "consumerDataSet": [consumer], "producerDataSet": []})
        return await self.raw.call(RequestCode.HEART_BEAT, {}, body.encode())

    def close(self) -> None:
        self.raw.close()
