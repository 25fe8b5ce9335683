"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``): sans-IO conversions
between its protobuf messages (the generated modules of ``rocketmq-python-client``) and the
remoting side's message properties."""
