// A reply streamed through Redis and resumed from a Last-Event-ID
// (docs/STREAMS.md; the Python package's ReplyStream reads the same streams).
// Run against `make run`'s server: node build-test/examples/reply_stream.js
import { createClient } from "redis";
import { RedisMem, ReplyStream } from "redis-mem";

const redis = createClient({ url: process.env["REDIS_URL"] ?? "redis://localhost:6379" });
await redis.connect();
const reader = redis.duplicate(); // readers block (XREAD BLOCK): their own connection
await reader.connect();
const mem = new RedisMem(redis);
const key = `mem:{stream-example-${process.pid}}`;

const reply = new ReplyStream(mem, key); // a fresh reply id
const first = await reply.write("Hel");
const resumed = (async () => {
  const out: string[] = [];
  // a client that got the first event comes back with it as Last-Event-ID
  for await (const e of new ReplyStream(new RedisMem(reader), key, { replyId: reply.replyId }).events(first)) {
    out.push(`${e.type}:${e.text}`);
  }
  return out;
})();
await reply.write("lo");
await reply.finish(); // MEM.APPEND key assistant "Hello" MSGID <reply id>, then the end event

console.log((await resumed).join(" ")); // chunk:lo end:
const [stored] = await mem.get(key);
console.log(stored?.role, stored?.content, stored?.msgId === reply.replyId); // assistant Hello true

await mem.delete(key);
await redis.quit();
await reader.quit();
