"""The remoting codec without a network: frames in both header forms round-trip, random and
truncated input only ever raises the codec's own error, fixed byte layouts match RocketMQ's."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameReader,
    RemotingCommand,
    decode_frame,
    encode,
    response_to,
)
from protocols.remoting.headers import PullMessageHeader, SendMessageHeader
from protocols.remoting.message_codec import (
    MESSAGE_MAGIC_CODE,
    WireMessage,
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
from store import tag_hash

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
commands = st.builds(
    RemotingCommand,
    code=st.integers(0, 65535),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    ext_fields=st.dictionaries(text, text, max_size=6),
    body=st.binary(max_size=200),
    remark=st.one_of(st.none(), text.filter(bool)),
    language=st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
    version=st.integers(0, 65535),
    serialize_type=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]),
)


@given(commands)
def test_frames_round_trip_in_both_header_forms(command: RemotingCommand) -> None:
    frame = encode(command)
    assert struct.unpack(">I", frame[:4])[0] == len(frame) - 4
    assert frame[4] == command.serialize_type  # the high byte of the second int
    (decoded,) = FrameReader().feed(frame)
    assert decoded == command


@given(st.lists(commands, min_size=1, max_size=4), st.integers(1, 50))
def test_reader_reassembles_frames_split_anywhere(batch: list[RemotingCommand], step: int) -> None:
    data = b"".join(encode(c) for c in batch)
    reader = FrameReader()
    got = []
    for i in range(0, len(data), step):
        got.extend(reader.feed(data[i:i + step]))
    assert got == batch


@given(st.binary(max_size=300))
def test_random_input_raises_only_the_codec_error(data: bytes) -> None:
    try:
        FrameReader(max_frame_size=4096).feed(data)
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
    with pytest.raises(RemotingProtocolError, match="exceeds the limit"):
        FrameReader(max_frame_size=1024).feed(struct.pack(">I", 2048))


def test_json_frame_layout_and_ext_field_values_of_any_json_type() -> None:
    header = json.dumps({"code": 34, "language": "JAVA", "version": 317, "opaque": 7, "flag": 0,
                         "extFields": {"queueId": 3, "unitMode": False, "topic": "T", "rate": 1.5}}).encode()
    frame = struct.pack(">II", 4 + len(header) + 2, len(header)) + header + b"hi"
    (command,) = FrameReader().feed(frame)
    assert command.code == 34 and command.opaque == 7 and command.body == b"hi"
    assert command.ext_fields == {"queueId": "3", "unitMode": "false", "topic": "T", "rate": "1.5"}
    reply = response_to(command, 0, ext_fields={"offset": "9"})
    assert reply.flag == FLAG_RESPONSE and reply.opaque == 7 and reply.serialize_type == SERIALIZE_JSON
    assert not RemotingCommand(40, flag=FLAG_ONEWAY).is_response and RemotingCommand(40, flag=FLAG_ONEWAY).is_oneway


def test_binary_header_layout() -> None:
    command = RemotingCommand(10, opaque=5, flag=0, ext_fields={"a": "bc"}, remark="r", language="JAVA", version=1,
                              serialize_type=SERIALIZE_ROCKETMQ)
    frame = encode(command)
    header = (struct.pack(">HBHii", 10, 0, 1, 5, 0) + struct.pack(">I", 1) + b"r"
              + struct.pack(">I", 2 + 1 + 4 + 2) + struct.pack(">H", 1) + b"a" + struct.pack(">I", 2) + b"bc")
    assert frame == struct.pack(">II", 4 + len(header), (1 << 24) | len(header)) + header
    assert decode_frame(frame[4:]) == command


def test_send_headers_in_full_and_short_names() -> None:
    full = SendMessageHeader.from_ext_fields(10, {"producerGroup": "p", "topic": "T", "queueId": "2", "sysFlag": "1",
                                                  "bornTimestamp": "99", "flag": "7", "properties": "x\x01y",
                                                  "reconsumeTimes": "3", "batch": "1"})
    short = SendMessageHeader.from_ext_fields(310, {"a": "p", "b": "T", "e": "2", "f": "1", "g": "99", "h": "7",
                                                    "i": "x\x01y", "j": "3", "m": "true"})
    assert full == short
    assert (full.topic, full.queue_id, full.flag, full.reconsume_times, full.batch) == ("T", 2, 7, 3, True)
    with pytest.raises(RemotingProtocolError, match="topic"):
        SendMessageHeader.from_ext_fields(10, {"queueId": "1"})
    with pytest.raises(RemotingProtocolError, match="queueOffset"):
        PullMessageHeader.from_ext_fields({"consumerGroup": "g", "topic": "T", "queueId": "0"})


@given(st.dictionaries(text.filter(lambda s: "\x01" not in s and "\x02" not in s and s),
                       text.filter(lambda s: "\x01" not in s and "\x02" not in s), max_size=6))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props
    assert decode_properties(encode_properties(props) + "\x02") == props  # Java's trailing separator


@given(st.lists(st.builds(BatchItem, body=st.binary(max_size=50), flag=st.integers(0, 2**31 - 1),
                          properties=st.just("TAGS\x01t\x02")), min_size=1, max_size=5))
def test_batch_bodies_round_trip(items: list[BatchItem]) -> None:
    assert decode_batch_body(encode_batch_body(items)) == items


@given(st.binary(max_size=100))
def test_bad_batch_bodies_raise_only_the_codec_error(data: bytes) -> None:
    try:
        decode_batch_body(data)
    except RemotingProtocolError:
        pass


def test_stored_message_layout_and_round_trip() -> None:
    message = WireMessage(topic="T", body=b"payload", queue_id=3, flag=1, queue_offset=42, commit_log_offset=4096,
                          sys_flag=0, born_timestamp=1000, born_host=b"\x0a\x00\x00\x01", born_port=5555,
                          store_timestamp=2000, store_host=b"\x7f\x00\x00\x01", store_port=10911, reconsume_times=2,
                          properties={"TAGS": "a", "KEYS": "k"})
    raw = encode_message(message)
    total, magic = struct.unpack_from(">ii", raw)
    assert total == len(raw) and magic == MESSAGE_MAGIC_CODE
    assert struct.unpack_from(">iiqq", raw, 12) == (3, 1, 42, 4096)  # queue id, flag, queue and commitlog offsets
    props = b"TAGS\x01a\x02KEYS\x01k"
    assert raw.endswith(struct.pack(">h", len(props)) + props)
    assert decode_messages(raw + raw) == [message, message]
    with pytest.raises(RemotingProtocolError):
        decode_messages(raw[:-3])


def test_offset_message_id_and_tag_hash_vectors() -> None:
    msg_id = offset_msg_id(b"\x7f\x00\x00\x01", 10911, 4096)
    assert msg_id == "7F00000100002A9F0000000000001000"
    assert decode_offset_msg_id(msg_id) == (b"\x7f\x00\x00\x01", 10911, 4096)
    assert tag_hash("TagA") == 2598919  # Java: "TagA".hashCode()
    assert tag_hash("\u4e2d\u6587\u6807\u7b7e") == _java_hash("\u4e2d\u6587\u6807\u7b7e")


def _java_hash(s: str) -> int:
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h
