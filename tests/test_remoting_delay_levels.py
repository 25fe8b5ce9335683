"""Delay levels (the ``DELAY`` property, and consumer retries) through the gateway's one timer: a
delayed message is written once and held, in no queue, until its level's delay has passed; pulled
then without ``DELAY``, as RocketMQ's broker clears it. (Its delivery through ali-ons and
librocketmq, retries included: test_remoting_ons.py, test_remoting_cpp.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.message_codec import decode_messages
from protocols.remoting.properties import encode_properties
from store.holds.codec import TIMER

from .remoting_support import RawRemoting, pull_header, remoting_gateway, send_header


async def test_a_delayed_message_is_held_once_and_pulled_without_its_delay(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_delay_levels="1s 2s") as (gw, addr):
        raw = await RawRemoting.open(addr)
        sent = time.monotonic()
        response = await raw.call(RequestCode.SEND_MESSAGE,
                                  send_header("Later", 0, properties=encode_properties({"DELAY": "2", "k": "v"})), b"x")
        assert response.code == ResponseCode.SUCCESS and response.ext_fields["queueOffset"] == "-1"
        assert gw.store.held.count(TIMER) == 1
        assert not [q for q, _ in ((s.name, n) for s, n in gw.store.index.iter_queues()) if q.startswith("sched:")]
        assert gw.store.max_offset_now("r:Later:0") == 0
        deadline = time.monotonic() + 10
        while gw.store.max_offset_now("r:Later:0") == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert time.monotonic() - sent >= 2.0
        pulled = await raw.call(RequestCode.PULL_MESSAGE, pull_header("Later", 0))
        (message,) = decode_messages(pulled.body)
        assert message.body == b"x" and "DELAY" not in message.properties and message.properties["k"] == "v"
        raw.close()
