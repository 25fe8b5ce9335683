"""The gateway process: opens the store, starts the listeners, shuts down cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from cache import QueueCache
from store import MessageStore

from .config import Config, parse_bind
from .mqtt.broker import MQTTBroker
from .mqtt.connection import MQTTConnection
from .mqtt.settings import MQTTSettings
from .placeholder import placeholder_handler

log = logging.getLogger("tidemq.gateway")

PROTOCOLS = ("mqtt", "amqp", "remoting")


@dataclass(slots=True)
class Listener:
    protocol: str
    server: asyncio.AbstractServer

    @property
    def address(self) -> tuple[str, int]:
        sock = self.server.sockets[0]
        host, port = sock.getsockname()[:2]
        return host, port


class Gateway:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.store: MessageStore | None = None
        self.mqtt: MQTTBroker | None = None
        self.listeners: list[Listener] = []

    async def start(self) -> None:
        self.store = await MessageStore.open(self.config.store_options())
        try:
            for protocol in PROTOCOLS:
                bind = parse_bind(getattr(self.config, f"{protocol}_bind"), f"{protocol}_bind")
                if bind is None:
                    log.info("listener off protocol=%s", protocol)
                    continue
                if protocol == "mqtt":
                    server = await self._start_mqtt(bind)
                else:
                    server = await asyncio.start_server(placeholder_handler(protocol), bind[0], bind[1])
                listener = Listener(protocol, server)
                self.listeners.append(listener)
                host, port = listener.address
                log.info("listener started protocol=%s address=%s:%d", protocol, host, port)
        except BaseException:
            await self.stop()
            raise
        log.info("gateway ready data_dir=%s flush=%s", self.config.data_dir, self.config.flush)

    async def _start_mqtt(self, bind: tuple[str, int]) -> asyncio.AbstractServer:
        assert self.store is not None
        cfg = self.config
        settings = MQTTSettings(allow_anonymous=getattr(cfg, "allow_anonymous", True))
        self.mqtt = MQTTBroker(self.store, settings, cache=QueueCache(self.store))
        await self.mqtt.start()
        broker = self.mqtt
        return await asyncio.get_running_loop().create_server(lambda: MQTTConnection(broker), bind[0], bind[1])

    async def stop(self) -> None:
        """Stop accepting, then flush, checkpoint and close the store, within the shutdown timeout."""
        for listener in self.listeners:
            listener.server.close()
        if self.mqtt is not None:
            await self.mqtt.stop()  # says goodbye to clients and saves every session
            self.mqtt = None
        for listener in self.listeners:
            await listener.server.wait_closed()
        self.listeners.clear()
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.close(), self.config.shutdown_timeout_s)
            except asyncio.TimeoutError:
                log.error("store did not close in time timeout_s=%s", self.config.shutdown_timeout_s)
            self.store = None
        log.info("gateway stopped")


async def serve(config: Config) -> None:
    gateway = Gateway(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await gateway.start()
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await gateway.stop()
