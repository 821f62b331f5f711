// The README's example: node-redis (or ioredis) + RedisMem, every MEM.* call typed.
// Run against `make run`'s server: node build-test/examples/quickstart.js
// (REDIS_URL to point elsewhere).
import { createClient } from "redis";
import { RedisMem, RedisMemError } from "redis-mem";

const redis = createClient({ url: process.env["REDIS_URL"] ?? "redis://localhost:6379", RESP: 3 });
await redis.connect();
const mem = new RedisMem(redis); // new RedisMem(new Redis()) for ioredis
const key = `mem:{example-${process.pid}}`;

await mem.append(key, "system", "You are a helpful travel assistant.", { model: "gpt-4o", ttl: 3600 });
const turn = await mem.append(key, "user", "Book the 8pm table", { msgId: "turn-42/user" });
const retry = await mem.append(key, "user", "Book the 8pm table", { msgId: "turn-42/user" });
console.log(turn.id, turn.tokens, turn.totalTokens, retry.duplicate); // 2 <tokens> <total> true

const context = await mem.get(key, { budget: 4000 }); // summary first, then the newest that fit
console.log(context.map((m) => `${m.role}: ${m.content}`).join("\n"));

const info = await mem.info(key);
console.log(info?.messages, info?.model, info?.contextWindow); // 2 gpt-4o 128000

try {
  await mem.import(key, await mem.getJson(key)); // the key exists
} catch (e) {
  if (e instanceof RedisMemError) console.log(e.code); // BUSYKEY
}
await mem.delete(key);
await redis.quit();
