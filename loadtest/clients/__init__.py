"""The load the benchmarks generate: raw-socket MQTT and AMQP clients, send-time stamps, the
forked publisher and subscriber processes built from them, and the reconnecting clients of the
chaos script."""
