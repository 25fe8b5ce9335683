"""A message's properties reach its consumers as the publisher encoded them (py-amqp, kombu's
client, over a gateway process). They used to be decoded by pamqp and encoded again for the store, which
turned a double in the headers (pika's encoding of a float) into pamqp's 32-bit float: 0.1
came back as 0.10000000149011612, and a double beyond float32's range failed the encoding and
took the publisher's connection down. A dead letter, whose headers the gateway does write again
(x-death), keeps its doubles too."""

from __future__ import annotations

import time
from pathlib import Path

import amqp
import pytest

from .crash_support import free_port, start_gateway, stop


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    proc = start_gateway(Path(tmp_path_factory.mktemp("data")), amqp_port=port)
    yield port
    stop(proc)


def test_header_doubles_come_back_exactly(port: int) -> None:
    headers = {"price": 0.1, "big": 1e300, "nested": {"ratio": 2 / 3}, "list": [0.2, "s"]}
    with amqp.Connection(host=f"127.0.0.1:{port}", connect_timeout=5, read_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_declare("props")
        channel.confirm_select()
        channel.basic_publish(amqp.Message(b"m", application_headers=headers, message_id="id-1", delivery_mode=2),
                              routing_key="props")
        message = channel.basic_get("props", no_ack=True)
    assert message is not None and message.body == b"m"
    assert message.headers == headers
    assert (message.properties["message_id"], message.properties["delivery_mode"]) == ("id-1", 2)


def test_a_dead_letter_keeps_its_header_doubles(port: int) -> None:
    headers = {"price": 0.1, "big": 1e300, "list": [2 / 3]}
    with amqp.Connection(host=f"127.0.0.1:{port}", connect_timeout=5, read_timeout=5) as conn:
        channel = conn.channel()
        channel.queue_declare("dead", durable=True)
        channel.queue_declare("source", durable=True, arguments={"x-dead-letter-exchange": "",
                                                                 "x-dead-letter-routing-key": "dead"})
        channel.confirm_select()
        channel.basic_publish(amqp.Message(b"d", application_headers=headers), routing_key="source")
        message = channel.basic_get("source")
        assert message is not None
        channel.basic_reject(message.delivery_tag, requeue=False)
        dead = None
        for _ in range(50):  # bounded: the dead letter is stored asynchronously
            dead = channel.basic_get("dead", no_ack=True)
            if dead is not None:
                break
            time.sleep(0.05)
    assert dead is not None and dead.body == b"d"
    assert {k: v for k, v in dead.headers.items() if not k.startswith("x-")} == headers
    assert dead.headers["x-death"][0]["reason"] == "rejected"
