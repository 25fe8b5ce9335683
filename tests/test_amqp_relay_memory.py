"""The AMQP relay's memory of a connection (sans-IO): frames split and grouped into commands
however the bytes arrive, what a failover replays, and the renumbering of delivery tags and
publish sequence numbers on the new server."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import body as pbody

from protocols.amqp.frames import PROTOCOL_HEADER
from protocols.amqp.relay_memory import (ACK, CONFIRM_SELECT_OK, CONSUME_OK, DELIVER, OPEN_OK, PUBLISH, QOS_OK,
                                         CommandAssembler, ConnectionMemory, FrameSplitter, NotAMQP, key)


def method(channel: int, value) -> bytes:
    return pframe.marshal(value, channel)


def content(channel: int, value, body: bytes, frame_max: int = 4096) -> list[bytes]:
    frames = [method(channel, value), pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()),
                                                     channel)]
    step = frame_max - 8
    frames += [pframe.marshal(pbody.ContentBody(body[i:i + step]), channel) for i in range(0, len(body), step)]
    return frames


def commands_of(frames: list[bytes], *, header: bool = False, chunk: int = 3):
    """The commands of these frames, fed ``chunk`` bytes at a time."""
    data = (PROTOCOL_HEADER if header else b"") + b"".join(frames)
    splitter, assembler = FrameSplitter(header=header), CommandAssembler()
    out = []
    for start in range(0, len(data), chunk):
        out += assembler.commands(splitter.feed(data[start:start + chunk]))
    return out


def delivery_tag(frames: list[bytes]) -> int:
    raw = frames[0]
    return struct.unpack_from(">Q", raw, 12 + raw[11])[0]


def ack_tag(frames: list[bytes]) -> tuple[int, bool]:
    value = pframe.unmarshal(frames[0])[2]
    return value.delivery_tag, value.multiple


def handshake(memory: ConnectionMemory) -> None:
    for value in (commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0guest"),
                  commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
                  commands.Connection.Open(virtual_host="/")):
        (command,) = commands_of([method(0, value)])
        memory.from_client(command)


def client(memory: ConnectionMemory, frames: list[bytes]):
    (command,) = commands_of(frames)
    return memory.from_client(command)


def server(memory: ConnectionMemory, frames: list[bytes]):
    (command,) = commands_of(frames)
    return memory.from_server(command)


def open_channel(memory: ConnectionMemory, number: int = 1) -> None:
    client(memory, [method(number, commands.Channel.Open())])
    server(memory, [method(number, commands.Channel.OpenOk())])


def test_frames_split_and_grouped_into_commands_whatever_the_reads() -> None:
    body = bytes(range(256)) * 40  # three body frames at frame_max 4096
    frames = [method(1, commands.Basic.Qos(prefetch_count=5)),
              *content(1, commands.Basic.Publish(exchange="", routing_key="q"), body),
              method(0, commands.Connection.Close(200, "bye", 0, 0))]
    for chunk in (1, 7, 1000, 100000):
        got = commands_of(frames, header=True, chunk=chunk)
        assert [c[1] for c in got[1:]] == [key(60, 10), PUBLISH, key(10, 50)]
        assert got[0][2] == [PROTOCOL_HEADER]
        assert b"".join(got[2][2]) == b"".join(frames[1:-1])  # the whole message, one command


def test_bytes_that_are_not_frames_are_refused() -> None:
    splitter = FrameSplitter(header=False)
    with pytest.raises(NotAMQP):
        splitter.feed(b"\x01\x00\x01\x00\x00\x00\x01xZ")  # no frame-end octet


def test_replay_opens_channels_with_prefetch_confirm_mode_and_consumers_the_server_named() -> None:
    memory = ConnectionMemory()
    handshake(memory)
    open_channel(memory, 1)
    client(memory, [method(1, commands.Basic.Qos(prefetch_count=7))])
    server(memory, [method(1, commands.Basic.QosOk())])
    client(memory, [method(1, commands.Confirm.Select())])
    server(memory, [method(1, commands.Confirm.SelectOk())])
    client(memory, [method(1, commands.Basic.Consume(queue="orders", consumer_tag=""))])
    server(memory, [method(1, commands.Basic.ConsumeOk(consumer_tag="amq.ctag-1"))])
    assert memory.replayable()
    memory.begin_replay()
    steps = memory.replay_steps()
    assert [(channel, reply) for _, channel, reply in steps][2:] == [
        (0, OPEN_OK), (1, key(20, 11)), (1, QOS_OK), (1, CONFIRM_SELECT_OK), (1, CONSUME_OK)]
    consume = pframe.unmarshal(steps[-1][0])[2]
    assert (consume.queue, consume.consumer_tag, consume.nowait) == ("orders", "amq.ctag-1", False)
    assert pframe.unmarshal(steps[4][0])[2].prefetch_count == 7


def test_delivery_tags_after_a_failover_continue_and_acks_of_old_ones_are_dropped() -> None:
    memory = ConnectionMemory()
    handshake(memory)
    open_channel(memory)
    for tag in (1, 2, 3):
        passed = server(memory, content(1, commands.Basic.Deliver("c", tag, False, "", "q"), b"x"))
        assert delivery_tag(passed) == tag
    memory.begin_replay()
    memory.after_replay()
    passed = server(memory, content(1, commands.Basic.Deliver("c", 1, True, "", "q"), b"x"))
    assert delivery_tag(passed) == 4  # the client's tags go on from 3
    assert client(memory, [method(1, commands.Basic.Ack(2))]) is None  # the old server's: delivered again
    assert ack_tag(client(memory, [method(1, commands.Basic.Ack(4))])) == (1, False)
    assert ack_tag(client(memory, [method(1, commands.Basic.Ack(4, multiple=True))])) == (1, True)
    assert ack_tag(client(memory, [method(1, commands.Basic.Ack(0, multiple=True))])) == (0, True)


def test_unconfirmed_publishes_are_published_again_and_their_confirms_carry_the_clients_numbers() -> None:
    memory = ConnectionMemory()
    handshake(memory)
    open_channel(memory)
    client(memory, [method(1, commands.Confirm.Select())])
    server(memory, [method(1, commands.Confirm.SelectOk())])
    for n in range(3):
        client(memory, content(1, commands.Basic.Publish(routing_key="q"), b"m%d" % n))
    assert ack_tag(server(memory, [method(1, commands.Basic.Ack(1))])) == (1, False)
    memory.begin_replay()
    again = memory.after_replay()
    assert again.count(b"m1") == 1 and again.count(b"m2") == 1 and b"m0" not in again
    client(memory, content(1, commands.Basic.Publish(routing_key="q"), b"m3"))  # the client's 4th, the server's 3rd
    assert ack_tag(server(memory, [method(1, commands.Basic.Ack(2, multiple=True))])) == (3, True)
    assert ack_tag(server(memory, [method(1, commands.Basic.Ack(3))])) == (4, False)
    assert server(memory, [method(1, commands.Basic.Ack(3))]) is None  # (confirmed already)


def test_an_unanswered_request_is_asked_again_after_the_replay() -> None:
    memory = ConnectionMemory()
    handshake(memory)
    open_channel(memory)
    declare = [method(1, commands.Queue.Declare(queue="orders", durable=True))]
    client(memory, declare)
    memory.begin_replay()
    assert memory.after_replay() == declare[0]
    server(memory, [method(1, commands.Queue.DeclareOk("orders", 0, 0))])
    memory.begin_replay()
    assert memory.after_replay() == b""


@pytest.mark.parametrize("request_, why", [
    (commands.Queue.Declare(queue="", exclusive=True), "queue"),
    (commands.Queue.Declare(queue="tmp", durable=False), "queue"),
    (commands.Exchange.Declare(exchange="x", durable=False), "exchange"),
    (commands.Tx.Select(), "transactional"),
])
def test_what_a_failover_loses_makes_the_connection_not_replayable(request_, why) -> None:
    memory = ConnectionMemory()
    handshake(memory)
    open_channel(memory)
    client(memory, [method(1, commands.Queue.Declare(queue="orders", durable=True))])
    assert memory.replayable()
    client(memory, [method(1, request_)])
    assert not memory.replayable() and why in memory.unreplayable


def test_a_deliver_before_the_channel_is_known_passes_unchanged() -> None:
    memory = ConnectionMemory()
    frames = content(5, commands.Basic.Deliver("c", 9, False, "", "q"), b"x")
    assert server(memory, frames) == frames
    assert DELIVER == key(60, 60) and ACK == key(60, 80)


def test_a_named_relay_says_who_it_is_and_names_what_it_publishes_again() -> None:
    """With a token (relay_identity.py): the start-ok the server sees carries the relay's
    identity of the generation (0, then 1 after a failover); the client's other properties are
    kept; a publish sent again carries the generation and sequence number of its first publish,
    which it keeps through a second failover; a first publish carries nothing."""
    memory = ConnectionMemory("00112233aabbccdd")
    start_ok = commands.Connection.StartOk(client_properties={"product": "app"}, mechanism="PLAIN",
                                           response="\0guest\0guest")
    (command,) = commands_of([method(0, start_ok)])
    sent = pframe.unmarshal(memory.from_client(command)[0])[2]
    assert sent.client_properties == {"product": "app", "x-tidemq-relay": "00112233aabbccdd.0"}
    assert sent.response == "\0guest\0guest"
    for value in (commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
                  commands.Connection.Open(virtual_host="/")):
        client(memory, [method(0, value)])
    open_channel(memory)
    client(memory, [method(1, commands.Confirm.Select())])
    server(memory, [method(1, commands.Confirm.SelectOk())])
    first = [content(1, commands.Basic.Publish(routing_key="q"), body) for body in (b"m0", b"m1")]
    for frames in first:
        assert client(memory, frames) == frames  # (unchanged the first time)
    server(memory, [method(1, commands.Basic.Ack(1))])

    def headers_sent_again() -> list:
        out = []
        for command in commands_of([memory.after_replay()], chunk=1 << 20):
            if command[1] == PUBLISH:
                out.append(pframe.unmarshal(command[2][1])[2].properties.headers)
        return out

    memory.begin_replay()
    (replayed_start_ok, *_), *_ = memory.replay_steps()[1:]
    assert pframe.unmarshal(replayed_start_ok)[2].client_properties["x-tidemq-relay"] == "00112233aabbccdd.1"
    assert headers_sent_again() == [{"x-tidemq-origin": "0:2"}]  # m1: generation 0, the server's 2nd
    memory.begin_replay()  # a second failover before it was confirmed: the same first name
    assert headers_sent_again() == [{"x-tidemq-origin": "0:2"}]
