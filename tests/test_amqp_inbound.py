"""The inbound side of an AMQP connection (gateway/amqp/inbound.py), through raw frames read in
one write: each confirming channel numbers its own publishes, a publish stored and one settled at
once (returned, or a direct reply) are confirmed once each, a return before its confirm, and a
transactional channel's publishes are stored by tx.commit before its commit-ok."""

from __future__ import annotations

from pathlib import Path

from pamqp import commands

from protocols.amqp.frames import content_frames, method_frame

from .amqp_support import RawAMQP, port_of, publish
from .test_amqp import amqp_gateway


def mandatory(channel: int, routing_key: str, body: bytes) -> bytes:
    return content_frames(channel, commands.Basic.Publish(exchange="", routing_key=routing_key, mandatory=True),
                          commands.Basic.Properties(), body, 131_072)


async def test_confirms_returns_and_a_commit_of_publishes_read_at_once(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        raw = await RawAMQP.open(port_of(url))
        raw.writer.write(method_frame(1, commands.Channel.Open()) + method_frame(1, commands.Queue.Declare(queue="q"))
                         + method_frame(1, commands.Confirm.Select()) + method_frame(2, commands.Channel.Open())
                         + method_frame(2, commands.Tx.Select()) + method_frame(3, commands.Channel.Open())
                         + method_frame(3, commands.Confirm.Select()))
        await raw.until(commands.Confirm.SelectOk)
        await raw.until(commands.Confirm.SelectOk)
        raw.writer.write(publish(1, "q", b"one") + mandatory(1, "nowhere", b"back")
                         + mandatory(1, "amq.rabbitmq.reply-to.nobody", b"reply") + publish(2, "q", b"in tx")
                         + publish(3, "q", b"other channel") + publish(1, "q", b"four")
                         + method_frame(2, commands.Tx.Commit()))
        frames = await raw.until(commands.Tx.CommitOk)
        assert not [f for f in frames if isinstance(f, commands.Basic.Nack)]
        told = [(type(f).__name__, f.delivery_tag if isinstance(f, commands.Basic.Ack) else f.routing_key)
                for f in frames if isinstance(f, (commands.Basic.Ack, commands.Basic.Return))]
        # channel 1 numbers 1-4, channel 3 its own 1: the returned ones are confirmed at once,
        # each after its return; the stored ones once stored, then the commit is answered
        assert told == [("Return", "nowhere"), ("Ack", 2), ("Return", "amq.rabbitmq.reply-to.nobody"), ("Ack", 3),
                        ("Ack", 1), ("Ack", 4), ("Ack", 1)]
        assert all(not f.multiple for f in frames if isinstance(f, commands.Basic.Ack))

        # every stored message is in the queue: the commit's after the publishes read before it
        raw.writer.write(method_frame(1, commands.Basic.Get(queue="q", no_ack=True)) * 5)
        frames = await raw.until(commands.Basic.GetEmpty)
        assert len([f for f in frames if isinstance(f, commands.Basic.GetOk)]) == 4
        assert [f.value for f in frames if type(f).__name__ == "ContentBody"] == [
            b"one", b"other channel", b"four", b"in tx"]
        raw.writer.close()
