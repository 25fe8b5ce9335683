"""What the benchmarks run against the brokers: the AMQP scenarios, the MQTT soak, the
processes of a benchmark cluster, and the replication group the chaos script injects faults into."""
