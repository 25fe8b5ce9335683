"""The load the benchmarks generate: raw-socket MQTT and AMQP clients, send-time stamps, and the
forked publisher and subscriber processes built from them."""
