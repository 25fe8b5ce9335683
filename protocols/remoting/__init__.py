"""RocketMQ's remoting protocol, sans-IO: frames and headers in both serialize types (JSON and
the compact ROCKETMQ binary form), request/response codes, typed send and pull headers,
message properties, batch bodies, the stored-message layout pull replies carry, and tags.

``frames`` is fed bytes and yields ``RemotingCommand``s; nothing here touches a socket."""
