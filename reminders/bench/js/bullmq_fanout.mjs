// BullMQ posting the same webhooks as our http topic, for bench_fanout: COUNT jobs (each one's
// data the payload our worker posts) added to a queue with no worker, then one Worker
// (concurrency = the topic's) whose processor signs the body as Standard Webhooks says
// (HMAC-SHA256 over "<id>.<timestamp>.<body>") and POSTs it with fetch, failing the job on any
// status but 2xx. A job done is a webhook the receiver answered.
//
// The Python side measures this process's CPU around the worker's run, so the adding happens
// before: it prints READY once every job is added, waits for "go" on stdin, runs the worker until
// every job is done (or failed), prints DONE <json>, and exits when stdin closes.
//   node bullmq_fanout.mjs '{"redis": "redis://...", "count": 20000, "concurrency": 16,
//       "prefix": "ccpeer-...", "modules": "var/peers/bullmq", "url": "http://127.0.0.1:P/bullmq",
//       "secret": "whsec_...", "topic": "bench.fanout", "timeout_s": 300}'
import { createRequire } from "node:module";
import crypto from "node:crypto";
import path from "node:path";
import readline from "node:readline";

const args = JSON.parse(process.argv[2]);
const require = createRequire(path.join(args.modules, "package.json"));
const { Queue, Worker } = require("bullmq");

const url = new URL(args.redis);
const connection = {
  host: url.hostname,
  port: Number(url.port || 6379),
  db: Number((url.pathname || "/0").slice(1) || 0),
  password: url.password || undefined,
  maxRetriesPerRequest: null,
};
const ADD_BATCH = 5000;
const key = Buffer.from(args.secret.replace(/^whsec_/, ""), "base64");
const lines = readline.createInterface({ input: process.stdin });
const nextLine = () =>
  new Promise((resolve) => {
    lines.once("line", resolve);
    lines.once("close", resolve);
  });

const queue = new Queue(`${args.prefix}-fanout`, { connection, prefix: args.prefix });
for (let i = 0; i < args.count; i += ADD_BATCH) {
  const size = Math.min(ADD_BATCH, args.count - i);
  await queue.addBulk(
    Array.from({ length: size }, (_, j) => ({
      name: "webhook",
      data: {
        job_id: i + j + 1,
        topic: args.topic,
        biz_type: "bench",
        biz_id: `f-${i + j}`,
        action_time: new Date().toISOString(),
        attribute: {},
      },
      opts: { removeOnComplete: true, removeOnFail: true, attempts: 1 },
    })),
  );
}
process.stdout.write("READY\n");
await nextLine();

let done = 0;
let failed = 0;
let resolveDone;
const finished = new Promise((resolve) => (resolveDone = resolve));
const started = Date.now();
const worker = new Worker(
  queue.name,
  async (job) => {
    const body = JSON.stringify(job.data, Object.keys(job.data).sort());
    const id = `${args.topic}:${job.data.job_id}`;
    const timestamp = Math.floor(Date.now() / 1000);
    const mac = crypto.createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest("base64");
    const response = await fetch(args.url, {
      method: "POST",
      body,
      redirect: "manual",
      signal: AbortSignal.timeout(10_000),
      headers: {
        "Content-Type": "application/json",
        "Idempotency-Key": id,
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": `v1,${mac}`,
      },
    });
    await response.arrayBuffer();
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
  },
  { connection, prefix: args.prefix, concurrency: args.concurrency },
);
const settle = () => {
  if (done + failed === args.count) resolveDone();
};
worker.on("completed", () => {
  done += 1;
  settle();
});
worker.on("failed", () => {
  failed += 1;
  settle();
});
const timeout = setTimeout(() => resolveDone(), args.timeout_s * 1000);
await finished;
clearTimeout(timeout);
const seconds = (Date.now() - started) / 1000;
process.stdout.write(`DONE ${JSON.stringify({ done, failed, seconds })}\n`);
await worker.close();
await queue.obliterate({ force: true });
await queue.close();
await nextLine();
process.exit(0);
