"""Replaying a rule (``tidemq ctl rules replay NAME --from TIME | --offset N``, a real subprocess):
its cursors moved to the first message stored at or after a time (the store's time lookup, as
RocketMQ's SEARCH_OFFSET_BY_TIMESTAMP) or to an offset; what was stored before the point is not
sent again, what was stored after it is, in order; refused points say why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, call, until
from .test_ctl import TOKEN, ctl
from .test_rules import admin_url


async def test_a_replay_from_a_time_sends_again_what_was_stored_from_then_and_nothing_before(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        url = admin_url(gw)
        status, row = await call(url, "POST", "/admin/rules", {
            "name": "all", "sources": ["meters/#"], "targets": [{"type": "webhook", "url": hook.url}]}, token=TOKEN)
        assert status == 201, row
        device = PahoClient(mqtt_port(gw), "meter")
        await device.connect()
        for n in range(2):
            await device.publish(f"meters/m{n}", json.dumps({"n": n}), 1)
        await hook.wait_for(2)
        await asyncio.sleep(0.01)  # (the next messages are stored in a later millisecond)
        for n in range(2, 5):
            await device.publish(f"meters/m{n}", json.dumps({"n": n}), 1)
        hits = await hook.wait_for(5)
        point = hits[2].headers["ce-time"]  # the store's time of message 2, RFC 3339 with milliseconds
        assert point > hits[1].headers["ce-time"]
        await until(lambda: gw.rules.engine.get("all")["lag"] == 0, what="the events done")

        code, out, err = await ctl(url, "rules", "replay", "all", "--from", point, "--json")
        assert code == 0, (out, err)
        row = json.loads(out)
        assert row["replayed_from"] == {"w:meters/#": 2} and row["state"] == "running"
        again = await hook.wait_for(8)
        await asyncio.sleep(0.3)  # (nothing more comes)
        assert [hit.json()["n"] for hit in again] == [0, 1, 2, 3, 4, 2, 3, 4]
        assert [hit.headers["ce-id"] for hit in again[5:]] == [hit.headers["ce-id"] for hit in hits[2:5]]

        code, out, err = await ctl(url, "rules", "replay", "all", "--offset", "4")
        assert code == 0 and "replayed_from" in out, (out, err)
        await hook.wait_for(9)
        await device.publish("meters/m5", json.dumps({"n": 5}), 1)  # (and it goes on from there)
        await hook.wait_for(10)
        await asyncio.sleep(0.3)
        assert [hit.json()["n"] for hit in hook.received[8:]] == [4, 5]
        await device.disconnect()
    await hook.down()


async def test_a_replay_point_that_cannot_be_is_refused_with_the_reason(data_dir: Path) -> None:
    hook = Webhook()
    await hook.up()
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", admin_token=TOKEN) as gw:
        url = admin_url(gw)
        for name, sources in (("one", ["meters/#"]), ("two", ["a/#", "b/#"])):
            status, row = await call(url, "POST", "/admin/rules", {
                "name": name, "sources": sources, "targets": [{"type": "webhook", "url": hook.url}]}, token=TOKEN)
            assert status == 201, row
        code, out, err = await ctl(url, "rules", "replay", "one")
        assert code == 2 and "give --from TIME or --offset N" in err, (out, err)
        code, out, err = await ctl(url, "rules", "replay", "nothing", "--offset", "0")
        assert code == 1 and "404" in err, (out, err)
        code, out, err = await ctl(url, "rules", "replay", "one", "--from", "yesterday")
        assert code == 2 and "RFC 3339" in err, (out, err)
        code, out, err = await ctl(url, "rules", "replay", "one", "--offset", "7")
        assert code == 2 and "7 is not in the queue w:meters/#: its offsets are 0 to 0" in err, (out, err)
        code, out, err = await ctl(url, "rules", "replay", "two", "--offset", "0")
        assert code == 2 and "reads 2 queues" in err, (out, err)
        status, answer = await call(url, "POST", "/admin/rules/one/replay", {"from": 0, "offset": 0}, token=TOKEN)
        assert status == 400, answer
        code, out, err = await ctl(url, "rules", "replay", "two", "--from", "2026-01-01T00:00:00+01:00", "--json")
        assert code == 0 and json.loads(out)["replayed_from"] == {"w:a/#": 0, "w:b/#": 0}, (out, err)
    await hook.down()
