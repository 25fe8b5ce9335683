"""The MQTT gateway: asyncio connections, sessions and push-pull delivery over the unified store."""
