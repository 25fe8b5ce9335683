"""Direct reply-to (RabbitMQ's ``amq.rabbitmq.reply-to``): an RPC client consumes from that
pseudo-queue in no-ack mode; its publishes with reply-to ``amq.rabbitmq.reply-to`` get a name of
their own, ``amq.rabbitmq.reply-to.<token>``, instead, and a publish to that name through the
default exchange goes straight to the client's channel: never stored, lost if that channel is
gone (a mandatory one is returned then), as RabbitMQ does."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from pamqp import commands

from protocols.amqp.frames import (
    PRECONDITION_FAILED,
    ContentReceived,
    channel_error,
    content_after_method,
    deliver_frame,
)

if TYPE_CHECKING:
    from .channel import Channel

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."


class DirectReplies:
    """The node's reply consumers, by the name their replies are published to."""

    def __init__(self) -> None:
        self._channels: dict[str, Channel] = {}

    def consume(self, channel: Channel, tag: str, m: commands.Basic.Consume) -> None:
        """basic.consume from ``amq.rabbitmq.reply-to``: no-ack only, one per channel."""
        if not m.no_ack:
            raise channel_error(PRECONDITION_FAILED, "reply consumer cannot acknowledge", channel.number, m)
        if channel.reply_consumer is not None:
            raise channel_error(PRECONDITION_FAILED, "reply consumer already set", channel.number, m)
        channel.reply_consumer = tag
        channel.reply_name = REPLY_PREFIX + secrets.token_urlsafe(18)
        self._channels[channel.reply_name] = channel

    def cancel(self, channel: Channel) -> None:
        """Its reply consumer is cancelled or its channel closes: replies to it are lost."""
        if channel.reply_name is not None:
            self._channels.pop(channel.reply_name, None)
            channel.reply_consumer = channel.reply_name = None

    def exists(self, name: str) -> bool:
        return name in self._channels

    @staticmethod
    def name_reply_to(channel: Channel, event: ContentReceived) -> None:
        """A publish asking for replies to ``amq.rabbitmq.reply-to`` names its channel's reply
        consumer instead; without one it is refused (406), as RabbitMQ does."""
        if event.reply_to != REPLY_QUEUE:
            return
        if channel.reply_name is None:
            raise channel_error(PRECONDITION_FAILED, "fast reply consumer does not exist", channel.number,
                                event.method)
        event.set_reply_to(channel.reply_name)

    def deliver(self, routing_key: str, event: ContentReceived) -> bool:
        """A publish to a reply name through the default exchange: delivered to its consumer
        (True), or lost when there is none."""
        channel = self._channels.get(routing_key)
        if channel is None or channel.closing or channel.reply_consumer is None:
            return False
        tag = channel.next_tag
        channel.next_tag += 1
        connection = channel.connection
        connection.send(deliver_frame(channel.number, channel.reply_consumer, tag, False, "", routing_key))
        connection.send(content_after_method(channel.number, event.raw_properties, event.body, connection.frame_max))
        connection.flush()
        return True
