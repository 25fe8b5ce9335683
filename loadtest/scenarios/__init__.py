"""What the benchmarks run against the brokers: the AMQP scenarios, the MQTT soak, and the
processes of a benchmark cluster."""
