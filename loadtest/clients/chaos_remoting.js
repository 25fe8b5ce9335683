'use strict';
// ali-ons (a third-party RocketMQ client) for loadtest/chaos_replication.py: a producer that sends
// numbered messages one at a time, each again until SEND_OK, or a push consumer that reports every
// delivery. Runs until its stdin closes; one JSON line per event on stdout. Needs NODE_PATH to hold
// tests/remoting_js/node_modules.
//
//   {"cmd": "produce", "nameSrv": ["127.0.0.1:P1", ...], "topic": "t", "tag": "r0leader_kill9"}
//     -> {"event": "sending", "id"} before each attempt, {"event": "sent", "id"} on SEND_OK,
//        {"event": "error", "message"} when an attempt fails
//   {"cmd": "consume", "nameSrv": [...], "topic": "t", "group": "g"}
//     -> {"event": "ready"}, then {"event": "message", "id", "reconsumeTimes"} per delivery

const { Producer, Consumer, Message } = require('ali-ons');

const spec = JSON.parse(process.argv[2]);
const httpclient = { request: async () => { throw new Error('no HTTP lookups'); } };
const quiet = { info() {}, warn() {}, debug() {}, error() {} };
const common = { httpclient, nameSrv: spec.nameSrv, logger: quiet, rebalanceInterval: 1000,
  pollNameServerInteval: 1000, heartbeatBrokerInterval: 1000, persistConsumerOffsetInterval: 500 };

let stopping = false;
const stopped = new Promise(resolve => {
  process.stdin.on('end', () => { stopping = true; resolve(); });
  process.stdin.on('close', () => { stopping = true; resolve(); });
  process.stdin.resume();
});
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

async function produce() {
  const producer = new Producer(Object.assign({ producerGroup: 'chaos-producer', sendMsgTimeout: 5000 }, common));
  producer.on('error', err => out({ event: 'error', message: err.message }));
  await producer.ready();
  let seq = 0;
  let pending = null;
  while (!stopping) {
    if (pending === null) {
      pending = `${spec.tag}/rmq/${seq}`;
      seq += 1;
    }
    out({ event: 'sending', id: pending });
    try {
      const result = await producer.send(new Message(spec.topic, '', pending));
      if (result.sendStatus === 'SEND_OK') {
        out({ event: 'sent', id: pending });
        pending = null;
        continue;
      }
      out({ event: 'error', message: result.sendStatus });
    } catch (err) {
      out({ event: 'error', message: err.message });
    }
    await sleep(100);
  }
  await producer.close();
}

async function consume() {
  const consumer = new Consumer(Object.assign({ consumerGroup: spec.group, instanceName: 'chaos',
    consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET', pullTimeDelayMillsWhenException: 200 }, common));
  consumer.on('error', err => out({ event: 'error', message: err.message }));
  consumer.subscribe(spec.topic, '*', async msg => {
    out({ event: 'message', id: msg.body.toString(), reconsumeTimes: msg.reconsumeTimes });
  });
  await consumer.ready();
  out({ event: 'ready' });
  await stopped;
  await consumer.close();
}

const commands = { produce, consume };
commands[spec.cmd]().then(() => process.exit(0), err => {
  console.error('chaos_remoting failed:', err && err.stack || err);
  process.exit(2);
});
