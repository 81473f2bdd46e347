// BullMQ's delayed jobs on the same Redis and the same workload as bench_reminders:
// a burst of COUNT jobs due in the same millisecond, then steady rates. Each job's lateness is
// when its no-op processor ran, less the moment it was due. Prints one JSON object.
//
// Writes the result to args.out. Run by `manage.py bench_peers`, which installs bullmq into var/peers/bullmq first:
//   node bullmq_bench.mjs '{"redis": "redis://...", "count": 200000, "rates": [2000, 5000],
//                           "seconds": 10, "concurrency": 50, "prefix": "ccpeer-..."}'
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

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

function pct(sorted, q) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

async function phase(name, dueTimes) {
  const queue = new Queue(`${args.prefix}-${name}`, { connection, prefix: args.prefix });
  const lateness = [];
  let last = 0;
  let resolveDone;
  const done = new Promise((resolve) => (resolveDone = resolve));
  const worker = new Worker(
    queue.name,
    async (job) => {
      const now = Date.now();
      lateness.push(now - job.data.due);
      last = now;
      if (lateness.length === dueTimes.length) resolveDone();
    },
    { connection, prefix: args.prefix, concurrency: args.concurrency, autorun: true },
  );
  await worker.waitUntilReady();
  const addStarted = Date.now();
  for (let i = 0; i < dueTimes.length; i += ADD_BATCH) {
    const now = Date.now();
    await queue.addBulk(
      dueTimes.slice(i, i + ADD_BATCH).map((due, j) => ({
        name: "remind",
        data: { due, n: i + j },
        opts: { delay: Math.max(0, due - now), removeOnComplete: true, removeOnFail: true },
      })),
    );
  }
  const addSeconds = (Date.now() - addStarted) / 1000;
  const timeout = setTimeout(() => resolveDone(), args.timeout_s * 1000);
  await done;
  clearTimeout(timeout);
  await worker.close();
  await queue.obliterate({ force: true });
  await queue.close();
  lateness.sort((a, b) => a - b);
  const first = dueTimes.reduce((a, b) => Math.min(a, b), Infinity);
  return {
    count: dueTimes.length,
    processed: lateness.length,
    add_per_s: Math.round(dueTimes.length / addSeconds),
    drain_s: (last - first) / 1000,
    lateness_ms: lateness,
  };
}

const result = {};
const start = Date.now() + Math.ceil(args.count / 20000) * 1000 + 3000;
const burst = await phase("burst", new Array(args.count).fill(start));
result.burst = burst;
for (const rate of args.rates) {
  const count = rate * args.seconds;
  const t0 = Date.now() + Math.ceil(count / 20000) * 1000 + 3000;
  const dues = Array.from({ length: count }, (_, i) => t0 + Math.floor((i * 1000) / rate));
  result[`steady_${rate}`] = await phase(`steady${rate}`, dues);
}
// A file, not stdout: process.exit() would cut a large pipe write short.
fs.writeFileSync(args.out, JSON.stringify(result));
process.exit(0);
