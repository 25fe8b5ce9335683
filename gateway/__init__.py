"""The TideMQ gateway: configuration, CLI, and the asyncio servers of each protocol."""

__version__ = "0.1.0"
