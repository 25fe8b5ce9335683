'use strict';
// Drives ali-ons (a third-party RocketMQ client) for the remoting tests. One JSON argument says
// what to do; every result is one JSON line on stdout. Bounded: every command has a deadline.
//
//   {"cmd": "send", "nameSrv": "127.0.0.1:9876", "group": "g", "topic": "t",
//    "messages": [{"tags": "TagA", "keys": ["k1"], "body": "text", "delayLevel": 0}], "intervalMs": 0}
//    (one {"event": "sent"} or, with "reportErrors", {"event": "error"} per message, with its body)
//   {"cmd": "consume", "nameSrv": ..., "group": "g", "topic": "t", "expression": "*", "count": 3,
//    "timeoutMs": 20000, "retryTimes": 0, "maxReconsumeTimes": 16, "instance": "c1", "fromFirst": false,
//    "expressionType": "SQL92"}   (without expressionType the expression is a TAG one)
//   {"cmd": "route", "nameSrv": ..., "topic": "t"}
//   {"cmd": "query", "nameSrv": ..., "topic": "t", "key": "k1"}   (QUERY_MESSAGE over ali-ons' remoting client)
//   {"cmd": "api", "nameSrv": ..., "calls": [["getMaxOffset", "$broker", "t", 0, 3000], ...]}
//    (ali-ons' own request methods (mq_client_api.js) in turn, "$broker" the broker's address: one
//    {"event": "result", "value"} or {"event": "error", "code", "message"} each)
// Any command: "accessKey" and "secretKey" sign every request (RocketMQ ACL); "send" with
// "reportErrors": true reports a refused message as {"event": "error", "code", "message"} and goes on
// ("consume": a refused pull, e.g. a SQL92 expression that does not parse).

const { Producer, Consumer, Message } = require('ali-ons');
const RemotingCommand = require('ali-ons/lib/protocol/command/remoting_command');
const MessageDecoder = require('ali-ons/lib/message/message_decoder');
const MQClientAPI = require('ali-ons/lib/mq_client_api');
const ByteBuffer = require('byte');

const spec = JSON.parse(process.argv[2]);
// ali-ons asks for an HTTP client to look up name servers; with nameSrv given it is never used
const httpclient = { request: async () => { throw new Error('no HTTP lookups in tests'); } };
const quiet = { info() {}, warn() {}, debug() {}, error(...args) { console.error(...args); } };
const common = { httpclient, nameSrv: spec.nameSrv, logger: quiet, rebalanceInterval: 1000,
  pollNameServerInteval: 1000, heartbeatBrokerInterval: 1000, persistConsumerOffsetInterval: 500 };
if (spec.accessKey) Object.assign(common, { accessKeyId: spec.accessKey, accessKeySecret: spec.secretKey });

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function plain(msg) {
  return { msgId: msg.msgId, topic: msg.topic, tags: msg.tags, keys: msg.keys, body: msg.body.toString(),
    queueId: msg.queueId, queueOffset: Number(msg.queueOffset), reconsumeTimes: msg.reconsumeTimes, flag: msg.flag,
    properties: msg.properties };
}

async function send() {
  const producer = new Producer(Object.assign({ producerGroup: spec.group || 'ons-producer' }, common));
  await producer.ready();
  for (const m of spec.messages) {
    const msg = new Message(spec.topic, m.tags || '', m.body);
    if (m.keys) msg.keys = m.keys;
    if (m.delayLevel) msg.delayTimeLevel = m.delayLevel;
    if (m.flag) msg.flag = m.flag;
    if (m.properties) Object.assign(msg.properties, m.properties);
    let result;
    try {
      result = await producer.send(msg);
    } catch (err) {
      if (!spec.reportErrors) throw err;
      out({ event: 'error', code: err.code ?? null, message: err.message, body: m.body });
      continue;
    }
    out({ event: 'sent', sendStatus: result.sendStatus, msgId: result.msgId, queueId: result.messageQueue.queueId,
      queueOffset: Number(result.queueOffset), body: m.body });
    if (spec.intervalMs) await new Promise(resolve => setTimeout(resolve, spec.intervalMs));
  }
  try {
    await producer.close();
  } catch (err) {
    if (!spec.reportErrors) throw err;
    out({ event: 'error', code: err.code ?? null, message: `close: ${err.message}` });
  }
}

async function consume() {
  const consumer = new Consumer(Object.assign({
    consumerGroup: spec.group, instanceName: spec.instance || 'c1', maxReconsumeTimes: spec.maxReconsumeTimes ?? 16,
    consumeFromWhere: spec.fromFirst ? 'CONSUME_FROM_FIRST_OFFSET' : 'CONSUME_FROM_LAST_OFFSET',
    pullTimeDelayMillsWhenException: 200,
  }, common));
  let received = 0;
  const failures = new Map();
  let finish;
  const done = new Promise(resolve => { finish = resolve; });
  consumer.on('error', err => {
    if (/the test asks for a retry|boot first/.test(err.message)) return;
    // a broker's refusal (MQClientException: the response code and remark) is an event
    if (spec.reportErrors && err.code !== undefined) out({ event: 'error', code: err.code, message: err.message });
    else console.error('consumer error', err.message);
  });
  // ali-ons' selector for other expression types than TAG: {expressionType, subString}
  const selector = spec.expressionType ? { expressionType: spec.expressionType, subString: spec.expression }
    : (spec.expression || '*');
  consumer.subscribe(spec.topic, selector, async msg => {
    const id = msg.originMessageId || msg.msgId; // a retried message keeps its first id there
    const seen = failures.get(id) || 0;
    out(Object.assign({ event: 'message', instance: spec.instance || 'c1' }, plain(msg)));
    if (seen < (spec.retryTimes || 0)) {
      failures.set(id, seen + 1);
      // a failure, not ACTION_RETRY: ali-ons 3.12.0's handler for %RETRY% messages drops the
      // return value of ours, so only a thrown error makes it send a retried message back again
      throw new Error('the test asks for a retry');
    }
    received += 1;
    if (spec.count && received >= spec.count) finish();
  });
  await consumer.ready();
  out({ event: 'ready' });
  const timer = setTimeout(finish, spec.timeoutMs || 20000);
  await done;
  clearTimeout(timer);
  await new Promise(resolve => setTimeout(resolve, spec.lingerMs || 600)); // offsets reach the broker
  await consumer.close();
  out({ event: 'done', received });
}

async function route() {
  const producer = new Producer(Object.assign({ producerGroup: 'ons-route' }, common));
  await producer.ready();
  const data = await producer._mqClient.getTopicRouteInfoFromNameServer(spec.topic, 3000);
  out({ event: 'route', route: data });
  await producer.close();
}

async function query() {
  const producer = new Producer(Object.assign({ producerGroup: 'ons-query' }, common));
  await producer.ready();
  const client = producer._mqClient;
  const routeData = await client.getTopicRouteInfoFromNameServer(spec.topic, 3000);
  const addr = routeData.brokerDatas[0].brokerAddrs['0'];
  const request = RemotingCommand.createRequestCommand(12, { topic: spec.topic, key: spec.key, maxNum: 32,
    beginTimestamp: 0, endTimestamp: Date.now() + 60000 });
  const response = await client.invoke(addr, request, 3000);
  const messages = [];
  if (response.code === 0 && response.body) {
    const buf = ByteBuffer.allocate(response.body.length);
    buf.put(response.body).flip();
    for (const msg of MessageDecoder.decodes(buf)) messages.push(plain(msg));
  }
  out({ event: 'query', code: response.code, messages });
  await producer.close();
}

async function api() {
  const producer = new Producer(Object.assign({ producerGroup: 'ons-api' }, common));
  await producer.ready();
  const client = producer._mqClient;
  const broker = spec.nameSrv; // (TideMQ's one node is name server and broker)
  for (const [name, ...args] of spec.calls) {
    try {
      // (MQClientAPI's own: MQClient overrides some with other signatures)
      const value = await MQClientAPI.prototype[name].apply(client, args.map(arg => (arg === '$broker' ? broker : arg)));
      out({ event: 'result', value: value === undefined ? null : value });
    } catch (err) {
      out({ event: 'error', code: err.code ?? null, message: err.message });
    }
  }
  await producer.close();
}

const commands = { send, consume, route, query, api };
const deadline = setTimeout(() => { console.error('ons_client: deadline passed'); process.exit(3); },
  (spec.timeoutMs || 20000) + 15000);
commands[spec.cmd]().then(() => { clearTimeout(deadline); process.exit(0); }, err => {
  console.error('ons_client failed:', err && err.stack || err);
  process.exit(2);
});
