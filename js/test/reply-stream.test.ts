// ReplyStream against a real server, on every client kind, and across
// languages: the Python package's ReplyStream writes, this one reads, and
// the other way round (docs/STREAMS.md).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  RedisMem, ReplyStream, ReplyStreamError, ReplyStreamGap, ReplyStreamTimeout, replyStreamKey, validEventId,
  type ReplyEvent,
} from "../src/index.js";
import { CLIENTS, REPO, startServer, type Server } from "./server.js";

let server: Server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe("layout", () => {
  it("stream keys in the session's slot; event ids checked", () => {
    assert.equal(replyStreamKey("mem:{alice}", "r1"), "mem:{alice}:reply:r1");
    assert.equal(replyStreamKey("chat:bob", "r1"), "{chat:bob}:reply:r1");
    assert.equal(replyStreamKey("x{tag}y", "r1"), "x{tag}y:reply:r1");
    assert.throws(() => replyStreamKey("a{}b", "r1"), RangeError); // an empty tag is none, and it holds }
    assert.throws(() => replyStreamKey("a}b", "r1"), RangeError);
    assert.throws(() => replyStreamKey("", "r1"), RangeError);
    assert.equal(validEventId(undefined), "0");
    assert.equal(validEventId(""), "0");
    assert.equal(validEventId("1796193606806-0"), "1796193606806-0");
    assert.equal(validEventId("17"), "17");
    for (const bad of ["$", "+", ">", "1-", "-1", "1-2-3", "x"]) assert.throws(() => validEventId(bad), RangeError);
  });
});

for (const kind of CLIENTS) {
  describe(`ReplyStream on ${kind.name}`, () => {
    let mem: RedisMem;
    let reader: RedisMem;
    const closers: Array<() => Promise<void>> = [];
    let n = 0;
    const key = (): string => `mem:{rs-${kind.name.replace(/ /g, "-")}-${++n}}`;

    before(async () => {
      const a = await kind.open(server.url, server.port);
      const b = await kind.open(server.url, server.port); // a blocking reader's own connection
      mem = a.mem; reader = b.mem; closers.push(a.close, b.close);
    });
    after(async () => { for (const c of closers) await c(); });

    it("write, finish: the events, the stored message (MSGID = reply id), the stream's TTL", async () => {
      const k = key();
      const s = new ReplyStream(mem, k, { ttl: 120 });
      assert.match(s.replyId, /^[0-9a-f]{32}$/);
      const ids = [await s.write("Hel"), await s.write("lo")];
      assert.equal(s.text, "Hello");
      const end = await s.finish({ meta: { model_used: "gpt-4o" } });
      assert.deepEqual(end, {
        id: end.id, type: "end", text: "", msgId: s.replyId, messageId: 1, meta: { model_used: "gpt-4o" }, chunks: 2,
      });
      const evs = await new ReplyStream(reader, k, { replyId: s.replyId }).read();
      assert.deepEqual(evs.map((e) => [e.id, e.type, e.text]), [[ids[0], "chunk", "Hel"], [ids[1], "chunk", "lo"], [end.id, "end", ""]]);
      const [m] = await mem.get(k);
      assert.deepEqual([m!.role, m!.content, m!.msgId, m!.meta], ["assistant", "Hello", s.replyId, { model_used: "gpt-4o" }]);
      const ttl = await s.ttlLeft();
      assert.ok(ttl > 100 && ttl <= 120, String(ttl));
      await assert.rejects(s.write("more"), /already ended/);
    });

    it("a retried finish stores once and writes one end event", async () => {
      const k = key();
      const s = new ReplyStream(mem, k, { replyId: "r-retry" });
      await s.write("Hi");
      const e1 = await s.finish();
      const again = new ReplyStream(mem, k, { replyId: "r-retry" });
      const e2 = await again.finish({ text: "Hi" });
      assert.equal(e2.id, e1.id);
      assert.equal((await mem.get(k)).length, 1);
      assert.equal((await again.read()).filter((e) => e.type === "end").length, 1);
    });

    it("resume from a Last-Event-ID while the producer writes (a blocking reader)", async () => {
      const k = key();
      const s = new ReplyStream(mem, k, { replyId: "r-live" });
      const first = await s.write("one ");
      const r = new ReplyStream(reader, k, { replyId: "r-live" });
      const reading = collect(r.chunks(first, { block: 50, idleTimeout: 5 }));
      for (const t of ["two ", "three"]) {
        await new Promise((ok) => setTimeout(ok, 30));
        await s.write(t);
      }
      await s.finish();
      assert.deepEqual(await reading, ["two ", "three"]);
      assert.deepEqual(await collect(r.chunks("0")), ["one ", "two ", "three"]);
      const evs: ReplyEvent[] = await collect(r.events());
      assert.equal(evs.at(-1)!.type, "end");
      assert.equal(evs.at(-1)!.messageId, 1);
    });

    it("an error event ends the reply; nothing is stored", async () => {
      const k = key();
      const s = new ReplyStream(mem, k, { replyId: "r-err" });
      await s.write("partial");
      const e = await s.error("the model failed");
      assert.equal(e.type, "error");
      await assert.rejects(collect(new ReplyStream(reader, k, { replyId: "r-err" }).chunks()),
        (err: unknown) => err instanceof ReplyStreamError && err.message === "the model failed");
      assert.deepEqual(await mem.get(k), []);
    });

    it("trimmed events are a gap, not a reply with a hole; an unknown reply times out; unknown types skipped", async () => {
      const k = key();
      const s = new ReplyStream(mem, k, { replyId: "r-gap", maxLen: 2, approximate: false });
      const first = await s.write("a");
      for (const t of ["b", "c", "d"]) await s.write(t);
      await assert.rejects(collect(new ReplyStream(reader, k, { replyId: "r-gap" }).events("0", { block: 10 })), ReplyStreamGap);
      await assert.rejects(collect(new ReplyStream(reader, k, { replyId: "r-gap" }).events(first, { block: 10 })), ReplyStreamGap);
      await assert.rejects(collect(new ReplyStream(reader, k, { replyId: "nope" }).events("0", { block: 10, idleTimeout: 0.1 })),
        ReplyStreamTimeout);
      const u = new ReplyStream(mem, k, { replyId: "r-new" });
      await mem.send(["XADD", u.streamKey, "*", "type", "tool-progress", "text", "50%"]);
      await u.write("x");
      await u.finish();
      assert.deepEqual((await collect(u.events())).map((e) => e.type), ["chunk", "end"]);
    });
  });
}

const PY = process.env["REDIS_MEM_PYTHON"] ?? join(REPO, "target", "venv", "bin", "python");

describe("across languages (the Python package's ReplyStream)", { skip: existsSync(PY) || process.env["REDIS_MEM_REQUIRE_PYTHON"] ? false : `no Python venv at ${PY} (REDIS_MEM_PYTHON)` }, () => {
  const py = (code: string): Promise<{ stdout: string }> => promisify(execFile)(PY, ["-c", code, String(server.port)]);

  for (const kind of CLIENTS) {
    it(`Python writes, TypeScript on ${kind.name} reads (and resumes)`, async () => {
      const { mem, close } = await kind.open(server.url, server.port);
      try {
        const k = `mem:{xl-py-${kind.resp}-${kind.name.length}}`;
        const { stdout } = await py(`
import sys, json, redis
from redis_mem import ReplyStream
s = ReplyStream(redis.Redis(port=int(sys.argv[1])), ${JSON.stringify(k)})
ids = [s.write(t) for t in ["Bon", "jour ", "\\u00e0 tous"]]
end = s.finish(meta={"model_used": "gpt-4o"})
print(json.dumps({"reply_id": s.reply_id, "ids": ids, "end": end.id}))
`);
        const out = JSON.parse(stdout) as { reply_id: string; ids: string[]; end: string };
        const r = new ReplyStream(mem, k, { replyId: out.reply_id });
        const evs = await collect(r.events());
        assert.deepEqual(evs.map((e) => e.id), [...out.ids, out.end]);
        assert.deepEqual(evs.at(-1), {
          id: out.end, type: "end", text: "", msgId: out.reply_id, messageId: 1, meta: { model_used: "gpt-4o" }, chunks: 3,
        });
        assert.deepEqual(await collect(r.chunks(out.ids[0])), ["jour ", "à tous"]);
        // a TypeScript finish of the same reply is a retry: stored once, one end event
        await new ReplyStream(mem, k, { replyId: out.reply_id }).finish({ text: "Bonjour à tous" });
        assert.equal((await mem.get(k)).length, 1);
        assert.equal((await mem.get(k))[0]!.content, "Bonjour à tous");
        assert.equal((await r.read()).filter((e) => e.type === "end").length, 1);
      } finally {
        await close();
      }
    });
  }

  it("TypeScript writes, Python reads (and resumes)", async () => {
    const { mem, close } = await CLIENTS[1]!.open(server.url, server.port);
    try {
      const k = "chat:ts-writes";
      const s = new ReplyStream(mem, k, { replyId: "r-ts" });
      const ids = [await s.write("Hello "), await s.write("from "), await s.write("TS")];
      await s.finish({ meta: { lang: "ts" } });
      const { stdout } = await py(`
import sys, json, redis
from redis_mem import ReplyStream
r = ReplyStream(redis.Redis(port=int(sys.argv[1])), "chat:ts-writes", "r-ts")
evs = list(r.events())
print(json.dumps({"key": r.stream_key, "chunks": list(r.chunks(${JSON.stringify(ids[0])})),
                  "all": "".join(r.chunks()), "end": [evs[-1].type, evs[-1].msgid, evs[-1].message_id, evs[-1].meta]}))
`);
      assert.deepEqual(JSON.parse(stdout), {
        key: "{chat:ts-writes}:reply:r-ts", chunks: ["from ", "TS"], all: "Hello from TS", end: ["end", "r-ts", 1, { lang: "ts" }],
      });
    } finally {
      await close();
    }
  });
});
