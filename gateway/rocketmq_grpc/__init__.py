"""RocketMQ 5 clients over gRPC (``apache.rocketmq.v2.MessagingService``) on the remoting node."""
