"""The RocketMQ remoting gateway: name-server and broker roles over the unified store."""
