"""``$SYS/broker/...`` statistics, published as retained messages every ``sys_interval_s``
(only the values that changed), under the topic names Mosquitto uses."""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .broker import MQTTBroker


def _version() -> str:
    try:
        return f"tidemq {version('tidemq')}"
    except PackageNotFoundError:
        return "tidemq"


def sys_values(broker: MQTTBroker) -> dict[str, str]:
    stats = broker.stats
    subscriptions = sum(len(s.subscriptions) for s in broker.sessions.values())
    values = {
        "$SYS/broker/version": _version(),
        "$SYS/broker/uptime": f"{int(time.time() - broker.started_at)} seconds",
        "$SYS/broker/clients/connected": str(len(broker.connections)),
        "$SYS/broker/clients/disconnected": str(len(broker.sessions) - len(broker.connections)),
        "$SYS/broker/clients/total": str(len(broker.sessions)),
        "$SYS/broker/messages/received": str(stats.messages_received),
        "$SYS/broker/messages/sent": str(stats.messages_sent),
        "$SYS/broker/publish/messages/dropped": str(stats.publish_dropped),
        "$SYS/broker/bytes/received": str(stats.bytes_received),
        "$SYS/broker/bytes/sent": str(stats.bytes_sent),
        "$SYS/broker/subscriptions/count": str(subscriptions),
        "$SYS/broker/retained messages/count": str(len(broker.retained)),
    }
    cache = broker.cache
    if cache is not None:
        cache_stats = cache.stats
        values["$SYS/broker/cache/hits"] = str(cache_stats.hits)
        values["$SYS/broker/cache/misses"] = str(cache_stats.misses)
    return values


async def publish_sys_topics(broker: MQTTBroker) -> None:
    last: dict[str, str] = {}
    while True:
        changed = [(topic, value) for topic, value in sys_values(broker).items() if last.get(topic) != value]
        if changed:
            broker.publish_internal([(topic, value.encode()) for topic, value in changed], retain=True)
            last.update(changed)
        await asyncio.sleep(broker.settings.sys_interval_s)
