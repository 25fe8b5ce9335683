"""What the AMQP relay of a gateway node costs per message, without sockets.

    python -m loadtest.micro_amqp_relay [--messages 200000] [--batch 50]

A gateway node relays each AMQP connection command by command (gateway/cluster/relay.py) so
that it can open it again on a new store leader. This feeds the frames of a real workload
through the relay's splitter, assembler and memory (protocols/amqp/relay_memory.py) in reads
of ``--batch`` messages, both directions: persistent 64-byte publishes in confirm mode, the
server's confirms (``multiple`` per batch), deliveries of the same messages and the client's
acks (one per delivery). One line:

    amqp_relay messages=N us_per_message=X publish_us=X confirm_us=X deliver_us=X ack_us=X
"""

from __future__ import annotations

import argparse
import time

from pamqp import commands
from pamqp import frame as pframe

from protocols.amqp.frames import PROTOCOL_HEADER, content_frames
from protocols.amqp.relay_memory import CommandAssembler, ConnectionMemory, FrameSplitter

FRAME_MAX = 131072


def run(messages: int, batch: int) -> dict[str, float]:
    memory = ConnectionMemory()
    up_split, up_cmds = FrameSplitter(header=True), CommandAssembler()
    down_split, down_cmds = FrameSplitter(header=False), CommandAssembler()

    def up(data: bytes) -> None:
        for command in up_cmds.commands(up_split.feed(data)):
            memory.from_client(command)

    def down(data: bytes) -> None:
        for command in down_cmds.commands(down_split.feed(data)):
            memory.from_server(command)

    handshake = [commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0g\0g"),
                 commands.Connection.TuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=60),
                 commands.Connection.Open(virtual_host="/")]
    up(PROTOCOL_HEADER + b"".join(pframe.marshal(m, 0) for m in handshake))
    for channel in (1, 2):
        up(pframe.marshal(commands.Channel.Open(), channel))
        down(pframe.marshal(commands.Channel.OpenOk(), channel))
    up(pframe.marshal(commands.Confirm.Select(), 1))
    down(pframe.marshal(commands.Confirm.SelectOk(), 1))
    up(pframe.marshal(commands.Basic.Consume(queue="q", consumer_tag="c"), 2))
    down(pframe.marshal(commands.Basic.ConsumeOk(consumer_tag="c"), 2))
    properties = commands.Basic.Properties(delivery_mode=2)
    body = b"x" * 64
    publishes = b"".join(content_frames(1, commands.Basic.Publish(exchange="", routing_key="q"), properties, body,
                                        FRAME_MAX) for _ in range(batch))
    rounds = messages // batch
    spent = dict.fromkeys(("publish", "confirm", "deliver", "ack"), 0.0)
    for n in range(rounds):
        first = n * batch + 1
        confirm = pframe.marshal(commands.Basic.Ack(first + batch - 1, multiple=True), 1)
        deliveries = b"".join(content_frames(2, commands.Basic.Deliver("c", tag, False, "", "q"), properties, body,
                                             FRAME_MAX) for tag in range(first, first + batch))
        acks = b"".join(pframe.marshal(commands.Basic.Ack(tag), 2) for tag in range(first, first + batch))
        for stage, direction, data in (("publish", up, publishes), ("confirm", down, confirm),
                                       ("deliver", down, deliveries), ("ack", up, acks)):
            started = time.perf_counter()
            direction(data)
            spent[stage] += time.perf_counter() - started
    done = rounds * batch
    return {stage: seconds * 1e6 / done for stage, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    costs = run(args.messages, args.batch)
    print(f"amqp_relay messages={args.messages} us_per_message={sum(costs.values()):.2f} "
          + " ".join(f"{stage}_us={us:.2f}" for stage, us in costs.items()))


if __name__ == "__main__":
    main()
