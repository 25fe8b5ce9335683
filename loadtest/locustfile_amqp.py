"""Locust load test for the AMQP 0-9-1 gateway (pika, the blocking client), as users run one:

    locust -f loadtest/locustfile_amqp.py --headless -u 20 -r 10 -t 60s --host amqp://guest:guest@127.0.0.1:5672/

Each simulated user has one connection and channel in confirm mode and its own exclusive
queue. It publishes persistent 64-byte messages to that queue through the default exchange and
reads them back with basic.get + ack, as often as it publishes (so ``deliver`` is the time a
message waits in its queue for the next get, not a growing backlog). Locust's table shows, per name:

- ``publish confirmed``: basic.publish to the broker's basic.ack (the message is durable per
  the gateway's flush mode; ``--flush sync`` means after fdatasync);
- ``get``: basic.get to basic.get-ok (or get-empty, counted too) and the ack written;
- ``deliver``: from the send time in the body to the moment basic.get returned it;
- ``connect``: connection.open, channel, confirm.select and queue.declare.

Failures are refused connections, nacked or unroutable publishes and closed channels.
"""

from __future__ import annotations

import logging
import struct
import time

import pika
from locust import User, between, events, task

PAYLOAD = 64
logging.getLogger("pika").setLevel(logging.WARNING)  # (it logs every connection at INFO)
_STAMP = struct.Struct(">d")


class AMQPUser(User):
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        started = time.perf_counter()
        try:
            self.connection = pika.BlockingConnection(pika.URLParameters(self.host or "amqp://guest:guest@127.0.0.1:5672/"))
            self.channel = self.connection.channel()
            self.channel.confirm_delivery()
            self.queue = self.channel.queue_declare("", exclusive=True).method.queue
            self._fire("connect", started, None)
        except pika.exceptions.AMQPError as exc:
            self._fire("connect", started, exc)
            raise

    def on_stop(self) -> None:
        try:
            self.connection.close()
        except pika.exceptions.AMQPError:
            pass

    @task(1)
    def publish_confirmed(self) -> None:
        started = time.perf_counter()
        body = _STAMP.pack(time.time()) + bytes(PAYLOAD - _STAMP.size)
        error: Exception | None = None
        try:
            self.channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
        except (pika.exceptions.NackError, pika.exceptions.UnroutableError, pika.exceptions.AMQPError) as exc:
            error = exc
        self._fire("publish confirmed", started, error)

    @task(1)
    def get(self) -> None:
        started = time.perf_counter()
        try:
            method, _, body = self.channel.basic_get(self.queue)
            if method is not None:
                self.channel.basic_ack(method.delivery_tag)
                (stamp,) = _STAMP.unpack_from(body)
                events.request.fire(request_type="AMQP", name="deliver", response_time=(time.time() - stamp) * 1000,
                                    response_length=len(body), exception=None, context={})
            self._fire("get", started, None)
        except pika.exceptions.AMQPError as exc:
            self._fire("get", started, exc)

    def _fire(self, name: str, started: float, error: Exception | None) -> None:
        events.request.fire(request_type="AMQP", name=name, response_time=(time.perf_counter() - started) * 1000,
                            response_length=PAYLOAD, exception=error, context={})
