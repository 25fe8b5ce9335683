"""The AMQP 0-9-1 gateway: exchanges, bindings and queues over the unified store."""
