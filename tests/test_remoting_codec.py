"""The remoting codec without a network: frames in both header forms round-trip, random and
truncated input only ever raises the codec's own error, fixed byte layouts match RocketMQ's."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.remoting.codes import LanguageCode, RequestCode, ResponseCode
from protocols.remoting.errors import FrameTooLarge, HeaderError, RemotingProtocolError
from protocols.remoting.frames import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameReader,
    RemotingCommand,
    decode_frame,
    encode,
    encode_head,
    response_to,
)
from protocols.remoting.headers import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    PullMessageHeader,
    PullMessageResponseHeader,
    SendMessageHeader,
    SendMessageResponseHeader,
)
from protocols.remoting.message_codec import (
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    WireMessage,
    body_crc,
    decode_messages,
    decode_offset_msg_id,
    encode_message,
    offset_msg_id,
)
from protocols.remoting.properties import (
    BatchItem,
    decode_batch_body,
    decode_properties,
    encode_batch_body,
    encode_properties,
)
from protocols.remoting.tags import parse_subscription, subscription_codes
from store import tag_hash  # the consume-queue side of the codes (tests/test_java_hash.py)

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
commands = st.builds(
    RemotingCommand,
    code=st.integers(0, 65535),
    opaque=i32,
    flag=st.integers(0, 3),
    ext_fields=st.dictionaries(text, text, max_size=6),
    body=st.binary(max_size=200),
    remark=st.one_of(st.none(), text.filter(bool)),
    language=st.sampled_from([lang.name for lang in LanguageCode]),
    version=st.integers(0, 65535),
    serialize_type=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]),
)


def _json_frame(header: dict | bytes, body: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack(">II", 4 + len(raw) + len(body), len(raw)) + raw + body


# -- frames --------------------------------------------------------------------------------
@given(commands)
def test_frames_round_trip_in_both_header_forms(command: RemotingCommand) -> None:
    frame = encode(command)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert frame[4] == command.serialize_type  # the high byte of the second int
    assert encode_head(command) + command.body == frame
    (decoded,) = FrameReader().feed(frame)
    assert decoded == command


@given(st.lists(commands, min_size=1, max_size=4), st.integers(1, 50))
def test_reader_reassembles_frames_split_anywhere(batch: list[RemotingCommand], step: int) -> None:
    data = b"".join(encode(c) for c in batch)
    reader = FrameReader()
    got = []
    for i in range(0, len(data), step):
        got.extend(reader.feed(data[i:i + step]))
    assert got == batch and reader.buffered == 0


@given(commands, st.data())
def test_truncated_frames_wait_for_the_rest(command: RemotingCommand, data: st.DataObject) -> None:
    frame = encode(command)
    cut = data.draw(st.integers(0, len(frame) - 1))
    reader = FrameReader()
    assert reader.feed(frame[:cut]) == [] and reader.buffered == cut
    assert reader.feed(frame[cut:]) == [command]


@given(st.binary(max_size=300))
def test_random_input_raises_only_the_codec_error(data: bytes) -> None:
    try:
        FrameReader(max_frame_size=4096).feed(data)
    except RemotingProtocolError:
        pass


@given(st.binary(max_size=200), st.sampled_from([0, 1]))
def test_random_headers_raise_only_the_codec_error(header: bytes, kind: int) -> None:
    frame = struct.pack(">I", (kind << 24) | len(header)) + header
    try:
        decode_frame(frame)
    except RemotingProtocolError:
        pass


@given(commands, st.data())
def test_corrupted_frames_raise_only_the_codec_error(command: RemotingCommand, data: st.DataObject) -> None:
    frame = bytearray(encode(command))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    try:
        FrameReader(max_frame_size=1 << 16).feed(bytes(frame))
    except RemotingProtocolError:
        pass


def test_oversized_frame_is_refused_before_it_is_buffered() -> None:
    reader = FrameReader(max_frame_size=1024)
    with pytest.raises(FrameTooLarge, match="exceeds the limit"):
        reader.feed(struct.pack(">I", 2048))  # the length prefix alone is enough
    assert reader.buffered == 0
    with pytest.raises(RemotingProtocolError):  # the stream cannot be resynchronised
        reader.feed(encode(RemotingCommand(34)))
    # the limit counts the length prefix, as RocketMQ's decoder does
    frame = encode(RemotingCommand(34, body=b"x" * 100))
    assert FrameReader(max_frame_size=len(frame)).feed(frame)
    with pytest.raises(FrameTooLarge):
        FrameReader(max_frame_size=len(frame) - 1).feed(frame[:4])


@pytest.mark.parametrize("prefix", [b"\x00\x00\x00\x03", b"\xff\xff\xff\xff"])
def test_impossible_frame_lengths_are_refused(prefix: bytes) -> None:
    with pytest.raises(RemotingProtocolError):
        FrameReader().feed(prefix)


def test_json_frame_known_bytes() -> None:
    header = (b'{"code":34,"language":"JAVA","version":401,"opaque":7,"flag":0,"extFields":{},'
              b'"serializeTypeCurrentRPC":"JSON"}')
    assert len(header) == 0x6F
    command = RemotingCommand(RequestCode.HEART_BEAT, language="JAVA", version=401, opaque=7)
    assert encode(command) == b"\x00\x00\x00\x73\x00\x00\x00\x6f" + header
    assert decode_frame(encode(command)[4:]) == command


def test_binary_frame_known_bytes() -> None:
    command = RemotingCommand(10, language="JAVA", version=401, opaque=1, remark="ok", ext_fields={"a": "b"},
                              body=b"xyz", serialize_type=SERIALIZE_ROCKETMQ)
    expected = bytes.fromhex(
        "00000026" "0100001f"  # length 38; serialize type 1, header length 31
        "000a" "00" "0191" "00000001" "00000000"  # code 10, JAVA, version 401, opaque 1, flag 0
        "00000002" "6f6b"  # remark "ok"
        "00000008" "0001" "61" "00000001" "62"  # extFields {"a": "b"}
        "78797a")  # body
    assert encode(command) == expected
    assert FrameReader().feed(expected) == [command]


def test_binary_header_layout() -> None:
    command = RemotingCommand(10, opaque=5, flag=0, ext_fields={"a": "bc"}, remark="r", language="JAVA", version=1,
                              serialize_type=SERIALIZE_ROCKETMQ)
    frame = encode(command)
    header = (struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">I", 1) + b"r"
              + struct.pack(">I", 2 + 1 + 4 + 2) + struct.pack(">H", 1) + b"a" + struct.pack(">I", 2) + b"bc")
    assert frame == struct.pack(">II", 4 + len(header), (1 << 24) | len(header)) + header
    assert decode_frame(frame[4:]) == command


def test_binary_header_empty_remark_and_fields_read_as_java_writes_them() -> None:
    command = RemotingCommand(11, remark="", serialize_type=SERIALIZE_ROCKETMQ)
    (decoded,) = FrameReader().feed(encode(command))
    assert decoded.remark is None and decoded.ext_fields == {}  # Java: length 0 reads as null


@pytest.mark.parametrize("header", [
    struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">ii", 0, 0) + b"junk",  # bytes after extFields
    struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">ii", -1, 0),  # negative remark length
    struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">ii", 0, 9) + b"\x00\x01a",  # extFields too long
    struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">ii", 0, 7) + b"\x00\x01a\x00\x00\x00\x05",
    struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">i", 1) + b"\xff" + struct.pack(">i", 0),  # not UTF-8
    struct.pack(">HBHii", 10, 0, 1, 5, 0),  # truncated
])
def test_malformed_binary_headers(header: bytes) -> None:
    with pytest.raises(RemotingProtocolError):
        decode_frame(struct.pack(">I", (1 << 24) | len(header)) + header)


def test_json_frame_layout_and_ext_field_values_of_any_json_type() -> None:
    header = json.dumps({"code": 34, "language": "JAVA", "version": 317, "opaque": 7, "flag": 0,
                         "extFields": {"queueId": 3, "unitMode": False, "batch": True, "topic": "T", "rate": 1.5,
                                       "gone": None}}).encode()
    (command,) = FrameReader().feed(_json_frame(header, b"hi"))
    assert command.code == 34 and command.opaque == 7 and command.body == b"hi" and command.remark is None
    assert command.ext_fields == {"queueId": "3", "unitMode": "false", "batch": "true", "topic": "T", "rate": "1.5"}
    reply = response_to(command, ResponseCode.SUCCESS, ext_fields={"offset": "9"})
    assert reply.flag == FLAG_RESPONSE and reply.opaque == 7 and reply.serialize_type == SERIALIZE_JSON
    assert reply.is_response and not reply.is_oneway
    assert not RemotingCommand(40, flag=FLAG_ONEWAY).is_response and RemotingCommand(40, flag=FLAG_ONEWAY).is_oneway


def test_json_header_as_ali_ons_and_fastjson_write_it() -> None:
    # ali-ons: no serializeTypeCurrentRPC, numbers in extFields; a Java peer may send "12" or an ordinal
    (command,) = FrameReader().feed(_json_frame(
        {"code": "310", "language": 0, "opaque": 1, "flag": 0, "version": 121, "extFields": {"e": 0, "k": False}}))
    assert (command.code, command.language, command.ext_fields) == (310, "JAVA", {"e": "0", "k": "false"})
    (command,) = FrameReader().feed(_json_frame({"code": 11, "language": "NODE_JS"}))
    assert command.language == "NODE_JS" and command.ext_fields == {} and command.opaque == 0


def test_replies_keep_the_serialize_type_of_their_request() -> None:
    request = RemotingCommand(11, opaque=99, serialize_type=SERIALIZE_ROCKETMQ)
    reply = response_to(request, ResponseCode.PULL_NOT_FOUND, "none", {"nextBeginOffset": "0"})
    assert (reply.code, reply.opaque, reply.flag, reply.remark) == (19, 99, FLAG_RESPONSE, "none")
    assert encode(reply)[4] == SERIALIZE_ROCKETMQ
    assert FrameReader().feed(encode(reply)) == [reply]


@pytest.mark.parametrize("header", [
    b"[1, 2]", b"{", b'{"code": 1.5}', b'{"code": true}', b'{"code": 99999999999}', b'{"code": NaN}',
    b'{"extFields": []}', b'{"extFields": {"a": {"b": 1}}}', b'{"extFields": {"a": [1]}}', b'{"remark": 5}',
    b'{"code": 1, "remark": "\\ud800"}', b'{"extFields": {"\\udc00": "x"}}', b"\xff\xfe{}", b"\xef\xbb\xbf{}",
    b"[" * 100_000,
])
def test_malformed_json_headers(header: bytes) -> None:
    with pytest.raises(RemotingProtocolError):
        FrameReader().feed(_json_frame(header))


def test_unknown_serialize_type_and_header_longer_than_frame() -> None:
    with pytest.raises(RemotingProtocolError, match="serialize type"):
        decode_frame(struct.pack(">I", (2 << 24) | 2) + b"{}")
    with pytest.raises(RemotingProtocolError, match="exceeds the frame"):
        decode_frame(struct.pack(">I", 10) + b"{}")


def test_what_the_binary_header_cannot_carry_is_refused_on_encoding() -> None:
    with pytest.raises(ValueError):
        encode(RemotingCommand(RequestCode.POP_MESSAGE, serialize_type=SERIALIZE_ROCKETMQ))
    with pytest.raises(ValueError):
        encode(RemotingCommand(10, opaque=2**31, serialize_type=SERIALIZE_ROCKETMQ))
    assert decode_frame(encode(RemotingCommand(RequestCode.POP_MESSAGE))[4:]).code == 200050  # JSON can


def test_codes_match_rocketmq() -> None:
    assert (RequestCode.SEND_MESSAGE, RequestCode.PULL_MESSAGE, RequestCode.HEART_BEAT, RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE, RequestCode.GET_ROUTEINFO_BY_TOPIC,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER) == (10, 11, 34, 310, 320, 105, 206)
    assert (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_OFFSET_MOVED,
            ResponseCode.QUERY_NOT_FOUND, ResponseCode.SUBSCRIPTION_NOT_LATEST) == (19, 20, 21, 22, 25)
    assert (LanguageCode.PYTHON, LanguageCode.GO) == (3, 9)


# -- headers -------------------------------------------------------------------------------
def test_send_headers_in_full_and_short_names() -> None:
    full = SendMessageHeader.from_ext_fields(10, {"producerGroup": "p", "topic": "T", "queueId": "2", "sysFlag": "1",
                                                  "bornTimestamp": "1700000000000", "flag": "7",
                                                  "properties": "x\x01y", "reconsumeTimes": "3", "batch": "1"})
    short = SendMessageHeader.from_ext_fields(310, {"a": "p", "b": "T", "e": "2", "f": "1", "g": "1700000000000",
                                                    "h": "7", "i": "x\x01y", "j": "3", "m": "true"})
    assert full == short
    assert (full.topic, full.queue_id, full.flag, full.reconsume_times, full.batch) == ("T", 2, 7, 3, True)
    assert full.born_timestamp == 1700000000000 and full.max_reconsume_times is None
    assert SendMessageHeader.from_ext_fields(320, {"b": "T", "e": "0"}).batch  # the code says batch
    assert not SendMessageHeader.from_ext_fields(310, {"b": "T", "e": "0", "m": "false"}).batch


@given(st.builds(SendMessageHeader, producer_group=text, topic=text.filter(bool), default_topic=text,
                 default_topic_queue_nums=i32, queue_id=i32, sys_flag=i32, born_timestamp=i64, flag=i32,
                 properties=text, reconsume_times=st.none() | i32, unit_mode=st.booleans(),
                 max_reconsume_times=st.none() | i32, batch=st.booleans(), broker_name=st.none() | text.filter(bool)))
def test_send_headers_round_trip_in_both_forms(header: SendMessageHeader) -> None:
    code = RequestCode.SEND_BATCH_MESSAGE if header.batch else RequestCode.SEND_MESSAGE_V2
    assert SendMessageHeader.from_ext_fields(code, header.to_ext_fields()) == header
    assert SendMessageHeader.from_ext_fields(RequestCode.SEND_MESSAGE, header.to_ext_fields(v2=False)) == header


@pytest.mark.parametrize("ext, field", [
    ({"queueId": "1"}, "topic"),
    ({"topic": "T"}, "queueId"),
    ({"topic": "T", "queueId": "one"}, "queueId"),
    ({"topic": "T", "queueId": "1", "sysFlag": "1.0"}, "sysFlag"),
    ({"topic": "T", "queueId": "2147483648"}, "queueId"),
    ({"topic": "T", "queueId": "1", "bornTimestamp": "9223372036854775808"}, "bornTimestamp"),
    ({"topic": "T", "queueId": " 1"}, "queueId"),
])
def test_bad_send_headers_name_their_field(ext: dict[str, str], field: str) -> None:
    with pytest.raises(HeaderError, match=field) as raised:
        SendMessageHeader.from_ext_fields(RequestCode.SEND_MESSAGE, ext)
    assert raised.value.field == field and raised.value.response_code == ResponseCode.SYSTEM_ERROR


@given(st.dictionaries(st.sampled_from(list("abcdefghijklmn") + ["topic", "queueId", "bornTimestamp", "batch"]),
                       text, max_size=8), st.sampled_from([10, 310, 320]))
def test_random_send_headers_raise_only_the_codec_error(ext: dict[str, str], code: int) -> None:
    try:
        SendMessageHeader.from_ext_fields(code, ext)
    except RemotingProtocolError:
        pass


def test_pull_header() -> None:
    ext = {"consumerGroup": "g", "topic": "T", "queueId": "1", "queueOffset": "5000000000", "maxMsgNums": "32",
           "sysFlag": str(PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION), "commitOffset": "4",
           "suspendTimeoutMillis": "15000", "subscription": "TagA || TagB", "subVersion": "1700000000000",
           "expressionType": "TAG"}
    header = PullMessageHeader.from_ext_fields(ext)
    assert (header.queue_offset, header.commit_offset, header.suspend_timeout_millis) == (5000000000, 4, 15000)
    assert header.flag_commit_offset and header.flag_suspend and header.flag_subscription
    assert PullMessageHeader.from_ext_fields(header.to_ext_fields()) == header
    with pytest.raises(RemotingProtocolError, match="queueOffset"):
        PullMessageHeader.from_ext_fields({"consumerGroup": "g", "topic": "T", "queueId": "0"})
    with pytest.raises(HeaderError, match="consumerGroup"):
        PullMessageHeader.from_ext_fields({"topic": "T", "queueId": "0", "queueOffset": "0"})


def test_response_headers() -> None:
    send = SendMessageResponseHeader("7F00000100002A9F0000000000001000", 2, 41, transaction_id="U1")
    assert send.to_ext_fields() == {"msgId": "7F00000100002A9F0000000000001000", "queueId": "2", "queueOffset": "41",
                                    "transactionId": "U1", "MSG_REGION": "DefaultRegion", "TRACE_ON": "false"}
    assert SendMessageResponseHeader.from_ext_fields(send.to_ext_fields()) == send
    pull = PullMessageResponseHeader(next_begin_offset=10, min_offset=0, max_offset=10)
    assert pull.to_ext_fields() == {"suggestWhichBrokerId": "0", "nextBeginOffset": "10", "minOffset": "0",
                                    "maxOffset": "10"}
    assert PullMessageResponseHeader.from_ext_fields(pull.to_ext_fields()) == pull


# -- properties and batches ----------------------------------------------------------------
@given(st.dictionaries(text.filter(lambda s: "\x01" not in s and "\x02" not in s and s),
                       text.filter(lambda s: "\x02" not in s), max_size=6))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props
    assert decode_properties(encode_properties(props) + "\x02") == props  # Java's trailing separator
    assert decode_properties(encode_properties(props).encode()) == props


def test_properties_known_forms() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k1 k2"}) == "TAGS\x01a\x02KEYS\x01k1 k2"  # no trailing \x02
    assert decode_properties("TAGS\x01a\x02KEYS\x01k\x01x\x02\x02junk\x02\x01v\x02") == {"TAGS": "a", "KEYS": "k\x01x"}
    assert decode_properties(b"TAGS\x01\xff\x02") == {"TAGS": "\ufffd"}
    with pytest.raises(ValueError):
        encode_properties({"A\x01": "b"})


@given(st.lists(st.builds(BatchItem, body=st.binary(max_size=50), flag=i32,
                          properties=st.just("TAGS\x01t\x02") | text), max_size=5))
def test_batch_bodies_round_trip(items: list[BatchItem]) -> None:
    assert decode_batch_body(encode_batch_body(items)) == items


def test_batch_body_known_bytes() -> None:
    # MessageDecoder.encodeMessage: totalSize, magic 0, body CRC 0, flag, body, short properties length
    raw = bytes.fromhex("0000001f" "00000000" "00000000" "00000003" "00000002") + b"hi" + b"\x00\x07TAGS\x01t\x02"
    assert encode_batch_body([BatchItem(3, b"hi", "TAGS\x01t\x02")]) == raw
    assert decode_batch_body(raw + raw) == [BatchItem(3, b"hi", "TAGS\x01t\x02")] * 2
    with pytest.raises(RemotingProtocolError):
        decode_batch_body(raw[:-1])


@given(st.binary(max_size=100))
def test_bad_batch_bodies_raise_only_the_codec_error(data: bytes) -> None:
    try:
        decode_batch_body(data)
    except RemotingProtocolError:
        pass


# -- stored messages -----------------------------------------------------------------------
def test_stored_message_layout_and_round_trip() -> None:
    message = WireMessage(topic="T", body=b"payload", queue_id=3, flag=1, queue_offset=42, commit_log_offset=4096,
                          sys_flag=0, born_timestamp=1000, born_host=b"\x0a\x00\x00\x01", born_port=5555,
                          store_timestamp=2000, store_host=b"\x7f\x00\x00\x01", store_port=10911, reconsume_times=2,
                          prepared_transaction_offset=0, properties={"TAGS": "a", "KEYS": "k"})
    raw = encode_message(message)
    props = b"TAGS\x01a\x02KEYS\x01k"
    expected = b"".join((
        struct.pack(">iiiii", 91 + 7 + 1 + len(props), MESSAGE_MAGIC_CODE, body_crc(b"payload"), 3, 1),
        struct.pack(">qqiq", 42, 4096, 0, 1000),  # queue offset, commitlog offset, sysFlag, born timestamp
        b"\x0a\x00\x00\x01", struct.pack(">iq", 5555, 2000),  # born host, port, store timestamp
        b"\x7f\x00\x00\x01", struct.pack(">iiqi", 10911, 2, 0, 7),  # store host, port, reconsume, prepared, body
        b"payload", b"\x01T", struct.pack(">h", len(props)), props))
    assert raw == expected
    assert body_crc(b"123456789") == 0xCBF43926 & 0x7FFFFFFF  # the CRC-32 check value, sign bit cleared
    assert decode_messages(raw + raw, check_crc=True) == [message, message]
    assert decode_messages(raw)[0].msg_id == "7F00000100002A9F0000000000001000"
    with pytest.raises(RemotingProtocolError):
        decode_messages(raw[:-3])


@given(st.builds(WireMessage, topic=text.filter(lambda s: len(s.encode()) <= 127), body=st.binary(max_size=64),
                 queue_id=i32, flag=i32, queue_offset=i64, commit_log_offset=i64,
                 sys_flag=st.integers(0, 0xF), born_timestamp=i64, born_host=st.binary(min_size=4, max_size=4),
                 born_port=i32, store_timestamp=i64, store_host=st.binary(min_size=4, max_size=4), store_port=i32,
                 reconsume_times=i32, prepared_transaction_offset=i64,
                 properties=st.dictionaries(text.filter(lambda s: s and "\x01" not in s and "\x02" not in s),
                                            text.filter(lambda s: "\x02" not in s), max_size=4)))
def test_stored_messages_round_trip(message: WireMessage) -> None:
    assert decode_messages(encode_message(message) * 2, check_crc=True) == [message, message]


def test_stored_messages_from_rocketmq_v2_and_ipv6() -> None:
    topic = b"t" * 200  # v2: a two-byte topic length
    v6 = b"\x20\x01" + b"\x00" * 13 + b"\x01"
    body = b"x"
    fixed = (struct.pack(">iiiiiqqiq", 0, MESSAGE_MAGIC_CODE_V2, body_crc(body), 0, 0, 1, 2, BORNHOST_V6_FLAG, 3)
             + v6 + struct.pack(">iq", 9, 4) + b"\x7f\x00\x00\x01" + struct.pack(">iiqi", 10911, 0, 0, len(body)))
    raw = bytearray(fixed + body + struct.pack(">h", len(topic)) + topic + struct.pack(">h", 0))
    raw[:4] = struct.pack(">i", len(raw))
    (message,) = decode_messages(bytes(raw), check_crc=True)
    assert (message.topic, message.born_host, message.born_port, message.store_timestamp) == ("t" * 200, v6, 9, 4)


def test_what_clients_cannot_read_is_refused_on_encoding() -> None:
    with pytest.raises(ValueError):
        encode_message(WireMessage(topic="t" * 128, body=b""))  # v1 topic length is a signed byte
    with pytest.raises(ValueError):
        encode_message(WireMessage(topic="t", body=b"", properties={"k": "v" * 40000}))
    with pytest.raises(ValueError):
        encode_message(WireMessage(topic="t", body=b"", store_host=b"\x00" * 16))


@given(st.binary(max_size=200))
def test_bad_message_bodies_raise_only_the_codec_error(data: bytes) -> None:
    try:
        decode_messages(data, check_crc=True)
    except RemotingProtocolError:
        pass


def test_offset_message_id_vectors() -> None:
    msg_id = offset_msg_id(b"\x7f\x00\x00\x01", 10911, 4096)
    assert msg_id == "7F00000100002A9F0000000000001000"
    assert decode_offset_msg_id(msg_id) == (b"\x7f\x00\x00\x01", 10911, 4096)
    assert offset_msg_id(b"\x0a\x00\x00\x01", 10911, 0x1234) == "0A00000100002A9F0000000000001234"
    for bad in ("7F000001", "7F00000100002A9F000000000000100G", "7F00000100002A9F 000000000000100"):
        with pytest.raises(RemotingProtocolError):
            decode_offset_msg_id(bad)


# -- tags ----------------------------------------------------------------------------------
def test_subscription_expressions() -> None:
    assert parse_subscription(None) is None and parse_subscription("") is None and parse_subscription("*") is None
    assert parse_subscription("TagA") == {"TagA"}
    assert parse_subscription(" TagA || TagB ||  ||\tTagC") == {"TagA", "TagB", "TagC"}
    assert parse_subscription("TagA|TagB") == {"TagA|TagB"}  # only "||" separates
    assert parse_subscription(" || ") == frozenset()  # selects nothing, as on a RocketMQ broker
    assert subscription_codes("TagA || TagB") == {2598919, tag_hash("TagB")}
    assert subscription_codes("*") is None
