"""RocketMQ's remoting protocol, sans-IO: frames and headers (JSON and the compact ROCKETMQ
binary form), request/response codes, message properties, batch bodies and the stored-message
layout that pull responses carry."""
