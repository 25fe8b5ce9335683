"""Sans-IO protocol codecs (MQTT, AMQP 0-9-1, RocketMQ remoting): bytes in, events out.

Nothing here opens a socket or imports asyncio; see ``gateway/`` for the I/O side.
"""
