// Every MEM.* command's reply shape on node-redis (RESP2, RESP3) and ioredis,
// against a real redis-server with the module.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { RedisMem, RedisMemError, type Message } from "../src/index.js";
import { createClient } from "redis";
import { Redis } from "ioredis";
import { CLIENTS, startServer, type Server } from "./server.js";

let server: Server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

const HEX32 = /^[0-9a-f]{32}$/;

async function rejectsWith(p: Promise<unknown>, code: string, command: string, re?: RegExp): Promise<RedisMemError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof RedisMemError, `expected a RedisMemError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    assert.equal(e.command, command);
    assert.ok(e instanceof Error);
    if (re) assert.match(e.message, re);
    return e;
  }
  assert.fail(`expected ${code}`);
}

for (const kind of CLIENTS) {
  describe(kind.name, () => {
    let mem: RedisMem;
    let close: () => Promise<void>;
    let n = 0;
    const key = (): string => `mem:{${kind.name.replace(/ /g, "-")}-${++n}}`;

    before(async () => { ({ mem, close } = await kind.open(server.url, server.port)); });
    after(async () => { await close(); });

    it(`replies come as RESP${kind.resp} (maps as ${kind.resp === 3 ? "maps" : "flat arrays"})`, async () => {
      const k = key();
      await mem.append(k, "user", "hi");
      const raw = await mem.send(["MEM.INFO", k]);
      assert.equal(Array.isArray(raw), kind.resp === 2);
      const hello = await mem.send(["CLIENT", "INFO"]);
      assert.match(String(hello), new RegExp(`resp=${kind.resp}`));
    });

    it("append: the reply, a generated MSGID, the module's own count", async () => {
      const k = key();
      const r = await mem.append(k, "user", "message number 1 about Rome");
      const tokens = await mem.count("gpt-4o", "message number 1 about Rome", { role: "user" });
      assert.match(r.msgId!, HEX32);
      assert.deepEqual(r, {
        id: 1, tokens, totalTokens: tokens, messages: 1, trimmed: 0, summarize: false, duplicate: false, msgId: r.msgId,
      });
      const r2 = await mem.append(k, "assistant", "Sure.");
      assert.equal(r2.id, 2);
      assert.equal(r2.messages, 2);
      assert.equal(r2.totalTokens, tokens + r2.tokens);
      assert.notEqual(r2.msgId, r.msgId);
      const got = await mem.get(k);
      assert.deepEqual(got.map((m) => m.msgId), [r.msgId, r2.msgId]);
    });

    it("append: a retry with the same msgId is a duplicate, stored once", async () => {
      const k = key();
      const first = await mem.append(k, "user", "Book the 8pm table", { msgId: "turn-42/user" });
      await mem.append(k, "assistant", "Done.");
      const retry = await mem.append(k, "user", "Book the 8pm table", { msgId: "turn-42/user" });
      assert.equal(first.duplicate, false);
      assert.equal(retry.duplicate, true);
      assert.equal(retry.id, first.id);
      assert.equal(retry.tokens, first.tokens);
      assert.equal(retry.messages, 2);
      assert.equal(retry.msgId, "turn-42/user");
      assert.equal((await mem.get(k)).length, 2);
    });

    it("append: options TS, META, MODEL, TTL, MAXTOKENS, MAXMSGS, MAXAGE, TOKENS", async () => {
      const k = key();
      const ts = Date.now() - 1000;
      const meta = { model_used: "gpt-4o", nested: { a: [1, 2] } };
      const r = await mem.append(k, "assistant", "Paris.", {
        ts, meta, model: "gpt-4-turbo", ttl: 3600, maxTokens: 5000, maxMsgs: 50, maxAge: 86400, tokens: 7,
        msgId: "m1",
      });
      assert.equal(r.tokens, 7);
      const [m] = await mem.get(k);
      assert.deepEqual(m, { id: 1, role: "assistant", content: "Paris.", ts, tokens: 7, meta, msgId: "m1", isSummary: false });
      const info = (await mem.info(k))!;
      assert.equal(info.model, "gpt-4-turbo");
      assert.equal(info.encoding, "cl100k_base");
      assert.equal(info.ttl, 3600);
      assert.equal(info.maxTokens, 5000);
      assert.equal(info.maxMsgs, 50);
      const pttl = Number(await mem.send(["PTTL", k]));
      assert.ok(pttl > 3_500_000 && pttl <= 3_600_000, String(pttl));
      // META as a JSON text is sent as is.
      await mem.append(k, "user", "x", { meta: '{"k":"v"}' });
      assert.deepEqual((await mem.get(k, { last: 1 }))[0]!.meta, { k: "v" });
    });

    it("append: MAXMSGS trims the oldest (trimmed, INFO evicted)", async () => {
      const k = key();
      for (let i = 1; i <= 3; i++) await mem.append(k, "user", `m${i}`, { maxMsgs: 3 });
      const r = await mem.append(k, "user", "m4");
      assert.equal(r.trimmed, 1);
      assert.equal(r.messages, 3);
      assert.deepEqual((await mem.get(k)).map((m) => m.content), ["m2", "m3", "m4"]);
      const info = (await mem.info(k))!;
      assert.equal(info.evicted, 1);
      assert.equal(info.firstId, 2);
      assert.equal(info.lastId, 4);
    });

    it("appendBatch: one result per message, msgIds generated or given, duplicates", async () => {
      const k = key();
      await mem.append(k, "user", "hello", { msgId: "u1" });
      const rs = await mem.appendBatch(k, [
        { role: "user", content: "hello", msgId: "u1" },
        { role: "assistant", content: "hi", meta: { tool_calls: [] }, tokens: 3 },
        { role: "user", content: "bye", ts: 1735689600000, meta: '{"x":1}' },
      ], { maxMsgs: 10, model: "gpt-4o" });
      assert.equal(rs.length, 3);
      assert.deepEqual(rs.map((r) => r.duplicate), [true, false, false]);
      assert.deepEqual(rs.map((r) => r.id), [1, 2, 3]);
      assert.equal(rs[0]!.msgId, "u1");
      assert.match(rs[1]!.msgId!, HEX32);
      assert.equal(rs[1]!.tokens, 3);
      assert.equal(rs[2]!.messages, 3);
      const got = await mem.get(k);
      assert.deepEqual(got.map((m) => [m.role, m.content, m.msgId]), [
        ["user", "hello", "u1"], ["assistant", "hi", rs[1]!.msgId], ["user", "bye", rs[2]!.msgId],
      ]);
      assert.equal(got[2]!.ts, 1735689600000);
      assert.deepEqual(got[2]!.meta, { x: 1 });
      assert.equal((await mem.info(k))!.maxMsgs, 10);
    });

    it("a META given as text goes in as written, by append and appendBatch; getJsonText -> import is exact", async () => {
      // Hostile pass 40 F2: appendBatch parsed the text and wrote it again
      // (integers past 2^53 rounded, 1.0000000000000001 became 1), and the
      // README's getJson -> import round trip did the same to every META.
      const k = key();
      const meta = '{"discord_user":123456789012345678901,"order":9007199254740993,"x":1.0000000000000001}';
      await mem.append(k, "user", "one", { meta });
      await mem.appendBatch(k, [{ role: "user", content: "two", meta }, { role: "assistant", content: "three" }]);
      await mem.attrSet(k, "profile", '{"user_id":123456789012345678901}', { raw: true });
      const doc = await mem.getJsonText(k);
      assert.equal(doc.split(meta).length, 3, doc);
      await assert.rejects(mem.appendBatch(k, [{ role: "user", content: "bad", meta: "{nope" }]), SyntaxError);
      const copy = key();
      await mem.import(copy, doc);
      assert.equal(await mem.getJsonText(copy), doc);
    });

    it("get: LAST, AFTER, BUDGET; [] for a missing key", async () => {
      const k = key();
      const ids: number[] = [];
      for (let i = 1; i <= 5; i++) ids.push((await mem.append(k, "user", `message ${i}`)).id);
      assert.deepEqual(await mem.get("mem:{missing}"), []);
      assert.deepEqual((await mem.get(k, { last: 2 })).map((m) => m.id), [4, 5]);
      assert.deepEqual((await mem.get(k, { after: 3 })).map((m) => m.id), [4, 5]);
      const all = await mem.get(k);
      const budget = all[3]!.tokens + all[4]!.tokens;
      assert.deepEqual((await mem.get(k, { budget })).map((m) => m.id), [4, 5]);
      assert.deepEqual(await mem.get(k, { budget: 1 }), []);
      for (const m of all) {
        assert.equal(typeof m.ts, "number");
        assert.equal(m.isSummary, false);
        assert.equal(m.meta, undefined);
      }
    });

    it("getJson: the FORMAT JSON document", async () => {
      const k = key();
      await mem.append(k, "user", "hi", { msgId: "a", meta: { x: 1 }, ts: 1735689600000 });
      await mem.attrSet(k, "user_profile", { name: "Alice" });
      const doc = await mem.getJson(k);
      const hist = doc["conversation_history"] as Array<Record<string, unknown>>;
      assert.equal(hist.length, 1);
      assert.equal(hist[0]!["content"], "hi");
      assert.equal(hist[0]!["msgid"], "a");
      assert.equal(hist[0]!["timestamp"], "2025-01-01T00:00:00.000Z");
      assert.deepEqual(hist[0]!["meta"], { x: 1 });
      assert.equal(doc["summary"], null);
      assert.equal(doc["model"], "gpt-4o");
      assert.equal(doc["total_tokens"], hist[0]!["tokens"]);
      assert.deepEqual(doc["user_profile"], { name: "Alice" });
      assert.equal((doc["redis_mem"] as Record<string, unknown>)["last_id"], 1);
      assert.equal(((await mem.getJson(k, { after: 1 }))["conversation_history"] as unknown[]).length, 0);
    });

    it("check, summarizeBegin, summarize: leases, LEASED, the summary entry, a duplicate summary", async () => {
      const k = key();
      for (let i = 1; i <= 6; i++) await mem.append(k, "user", `message number ${i} about Rome`);
      const c = await mem.check(k, { context: 100, keep: 2 });
      assert.deepEqual(Object.keys(c).sort(), [
        "keep", "messages", "summarize", "thresholdMessages", "thresholdTokens", "totalTokens", "upto", "uptoTokens",
      ]);
      assert.equal(c.summarize, true);
      assert.equal(c.messages, 6);
      assert.equal(c.keep, 2);
      assert.equal(c.upto, 4);
      assert.equal(c.thresholdTokens, 15);
      assert.ok(c.uptoTokens > 0 && c.uptoTokens < c.totalTokens);
      assert.equal((await mem.check(k)).summarize, false);

      const b = await mem.summarizeBegin(k, 60000, { context: 100, keep: 2 });
      assert.equal(b.upto, 4);
      assert.ok(b.lease > 0);
      assert.ok(b.leaseExpires > Date.now() && b.leaseExpires <= Date.now() + 61000);
      const other = await mem.summarizeBegin(k, 60000, { context: 100, keep: 2 });
      assert.equal(other.lease, 0);
      assert.equal(other.leaseExpires, b.leaseExpires);
      const leaseTtl = (await mem.info(k))!.leaseTtl!;
      assert.ok(leaseTtl > 0 && leaseTtl <= 60000, String(leaseTtl));

      await rejectsWith(mem.summarize(k, b.upto, "Rome, six times."), "LEASED", "MEM.SUMMARIZE");
      const s = await mem.summarize(k, b.upto, "Rome, six times.", { lease: b.lease });
      assert.equal(s.id, 4);
      assert.equal(s.messages, 2);
      assert.equal(s.trimmed, 0);
      assert.equal(s.duplicate, false);
      assert.equal(s.msgId, undefined);
      const again = await mem.summarize(k, b.upto, "Rome, six times.");
      assert.equal(again.duplicate, true);

      const got = await mem.get(k);
      assert.deepEqual(got.map((m: Message) => [m.role, m.isSummary, m.id]), [
        ["summary", true, 4], ["user", false, 5], ["user", false, 6],
      ]);
      assert.equal(got[0]!.content, "Rome, six times.");
      const info = (await mem.info(k))!;
      assert.equal(info.summaryUpto, 4);
      assert.equal(info.summarized, 4);
      assert.ok(info.summaryTs! > 0);
      assert.equal(info.leaseTtl, 0);
      await rejectsWith(mem.summarize(k, 99, "x"), "ERR", "MEM.SUMMARIZE", /upto 99/);
    });

    it("extSet / extGet (EX) and INFO's external, external_ttl", async () => {
      const k = key();
      await mem.append(k, "user", "hi");
      assert.equal(await mem.extSet(k, "openai", "conv_abc"), true);
      assert.equal(await mem.extSet(k, "langgraph", "thread-9", { ex: 100 }), true);
      assert.equal(await mem.extGet(k, "openai"), "conv_abc");
      assert.equal(await mem.extGet(k, "langgraph"), "thread-9");
      assert.equal(await mem.extGet(k, "nope"), null);
      const info = (await mem.info(k))!;
      assert.deepEqual([...info.external].sort(), ["langgraph", "openai"]);
      const ttl = info.externalTtl!;
      assert.ok(ttl["langgraph"]! > 90_000 && ttl["langgraph"]! <= 100_000, JSON.stringify(ttl));
      assert.ok(typeof ttl["openai"] === "number");
    });

    it("attrSet (EX, raw) / attrGet / attrDel", async () => {
      const k = key();
      assert.equal(await mem.attrSet(k, "user_profile", { name: "Alice", langs: ["fr"] }), true);
      assert.equal(await mem.attrSet(k, "context", '{"plan":"pro"}', { raw: true, ex: 100 }), true);
      assert.deepEqual(await mem.attrGet(k, "user_profile"), { name: "Alice", langs: ["fr"] });
      assert.equal(await mem.attrGet(k, "context", { raw: true }), '{"plan":"pro"}');
      assert.equal(await mem.attrGet(k, "nope"), null);
      assert.deepEqual(await mem.attrGet(k), { user_profile: { name: "Alice", langs: ["fr"] }, context: { plan: "pro" } });
      assert.equal(await mem.attrDel(k, "context"), true);
      assert.equal(await mem.attrDel(k, "context"), false);
      assert.deepEqual(await mem.attrGet(k), { user_profile: { name: "Alice", langs: ["fr"] } });
      await mem.attrSet(k, "short", 1, { ex: 1 });
      assert.equal(await mem.attrGet(k, "short"), 1);
      await new Promise((r) => setTimeout(r, 1100));
      assert.equal(await mem.attrGet(k, "short"), null);
      await rejectsWith(mem.attrSet(k, "bad", "{nope", { raw: true }), "ERR", "MEM.ATTRSET");
    });

    it("info: every field; null for a missing key", async () => {
      const k = key();
      const before = Date.now();
      const r = await mem.append(k, "user", "hi", { ttl: 600 });
      const info = await mem.info(k);
      assert.ok(info);
      assert.deepEqual(Object.keys(info).sort(), [
        "contextWindow", "created", "encoding", "evicted", "external", "externalTtl", "firstId", "lastId",
        "leaseTtl", "maxMsgs", "maxTokens", "messages", "model", "summarized", "summaryTs", "summaryUpto",
        "totalTokens", "ttl", "updated",
      ]);
      assert.equal(info.messages, 1);
      assert.equal(info.totalTokens, r.tokens);
      assert.equal(info.model, "gpt-4o");
      assert.equal(info.encoding, "o200k_base");
      assert.equal(info.contextWindow, 128000);
      assert.ok(info.maxTokens > 0 && info.maxMsgs > 0);
      assert.equal(info.ttl, 600);
      assert.equal(info.firstId, 1);
      assert.equal(info.lastId, 1);
      assert.ok(info.created >= before - 5 && info.updated >= info.created);
      assert.equal(info.summaryUpto, 0);
      assert.deepEqual(info.external, []);
      assert.deepEqual(info.externalTtl, {});
      assert.equal(info.evicted, 0);
      assert.equal(info.summarized, 0);
      assert.equal(info.summaryTs, 0);
      assert.equal(info.leaseTtl, 0);
      assert.equal(await mem.info("mem:{missing}"), null);
    });

    it("count (ROLE, META) and models (one, all)", async () => {
      const plain = await mem.count("gpt-4o", "Hello there");
      assert.ok(plain > 0);
      const asUser = await mem.count("gpt-4o", "Hello there", { role: "user" });
      assert.ok(asUser >= plain);
      const tool = { tool_calls: [{ id: "c1", type: "function", function: { name: "weather", arguments: '{"city":"Paris"}' } }] };
      assert.ok((await mem.count("gpt-4o", "Hello there", { role: "assistant", meta: tool })) > asUser);

      assert.deepEqual(await mem.models("gpt-4-turbo"), {
        model: "gpt-4-turbo", encoding: "cl100k_base", exact: true, contextWindow: 128000,
        entry: (await mem.models("gpt-4-turbo")).entry, source: "builtin",
      });
      const claude = await mem.models("claude-opus-4-5");
      assert.equal(claude.exact, false);
      assert.equal(claude.contextWindow, 200000);
      const unknown = await mem.models("no-such-model-xyz");
      assert.equal(unknown.entry, null);
      assert.equal(unknown.source, "none");
      const table = await mem.models();
      assert.ok(table.length > 10);
      for (const e of table) {
        assert.equal(typeof e.name, "string");
        assert.equal(typeof e.encoding, "string");
        assert.equal(typeof e.contextWindow, "number");
        assert.ok(e.source === "builtin" || e.source === "config");
      }
      assert.ok(table.some((e) => e.name === (claude.entry ?? "")));
    });

    it("import: getJson's document into a new key; BUSYKEY; REPLACE", async () => {
      const src = key();
      await mem.append(src, "user", "one", { msgId: "x1" });
      await mem.append(src, "assistant", "two", { meta: { a: 1 } });
      await mem.attrSet(src, "user_profile", { name: "Bob" });
      const doc = await mem.getJson(src);
      const dst = key();
      const r = await mem.import(dst, doc);
      assert.equal(r.messages, 2);
      assert.equal(r.duplicate, false);
      const strip = (ms: Message[]): unknown => ms.map(({ id, role, content, ts, tokens, meta, msgId }) => ({ id, role, content, ts, tokens, meta, msgId }));
      assert.deepEqual(strip(await mem.get(dst)), strip(await mem.get(src)));
      assert.deepEqual(await mem.attrGet(dst, "user_profile"), { name: "Bob" });
      await rejectsWith(mem.import(dst, doc), "BUSYKEY", "MEM.IMPORT");
      const r2 = await mem.import(dst, JSON.stringify({ conversation_history: [{ role: "user", content: "fresh" }] }), {
        replace: true, model: "gpt-4-turbo", ttl: 100,
      });
      assert.equal(r2.messages, 1);
      const info = (await mem.info(dst))!;
      assert.equal(info.model, "gpt-4-turbo");
      assert.equal(info.ttl, 100);
      // the retried msgid is still known after the import
      const dst2 = key();
      await mem.import(dst2, doc);
      assert.equal((await mem.append(dst2, "user", "one", { msgId: "x1" })).duplicate, true);
    });

    it("errors keep the Redis error code: ERR, WRONGTYPE", async () => {
      const k = key();
      await mem.send(["SET", k, "a string"]);
      const e = await rejectsWith(mem.get(k), "WRONGTYPE", "MEM.GET");
      assert.equal(e.name, "RedisMemError");
      assert.ok(e.cause instanceof Error);
      await rejectsWith(mem.append(k, "user", "x"), "WRONGTYPE", "MEM.APPEND");
      await rejectsWith(mem.append(key(), "user", "x", { maxMsgs: -1 }), "ERR", "MEM.APPEND");
      await rejectsWith(mem.append(key(), "user", "x", { meta: "[1]" }), "ERR", "MEM.APPEND");
      await rejectsWith(mem.check(key(), { model: "gpt-4o", context: 100 }), "ERR", "MEM.SUMMARIZE_CHECK");
      await rejectsWith(mem.send(["MEM.APPEND", k]), "ERR", "MEM.APPEND", /wrong number of arguments/);
    });

    it("delete", async () => {
      const k = key();
      await mem.append(k, "user", "x");
      assert.equal(await mem.delete(k), true);
      assert.equal(await mem.delete(k), false);
      assert.equal(await mem.info(k), null);
    });
  });
}

describe("client detection", () => {
  it("refuses what is no Redis client", () => {
    assert.throws(() => new RedisMem({} as never), TypeError);
  });

  it("takes a Transport; autoMsgId false sends no MSGID", async () => {
    const seen: unknown[][] = [];
    const { mem: real, close } = await CLIENTS[0]!.open(server.url, server.port);
    try {
      const mem = new RedisMem({ send: (args) => { seen.push(args); return real.send(args); } }, { autoMsgId: false });
      const r = await mem.append("mem:{transport}", "user", "hi");
      assert.equal(r.msgId, undefined);
      assert.deepEqual(seen[0], ["MEM.APPEND", "mem:{transport}", "user", "hi"]);
      assert.equal((await mem.get("mem:{transport}"))[0]!.msgId, undefined);
      await rejectsWith(mem.send(["MEM.GET"]), "ERR", "MEM.GET");
    } finally {
      await close();
    }
  });
});

describe("Redis stopped", () => {
  it("a connection error is the client's own, not a RedisMemError, on both clients", async () => {
    const own = await startServer();
    const nr = createClient({ url: own.url, socket: { reconnectStrategy: false } });
    nr.on("error", () => {});
    await nr.connect();
    const io = new Redis({ port: own.port, host: "127.0.0.1", maxRetriesPerRequest: 0, retryStrategy: () => null });
    io.on("error", () => {});
    try {
      for (const mem of [new RedisMem(nr), new RedisMem(io)]) {
        assert.equal((await mem.append("mem:{down}", "user", "before", { msgId: `b-${Math.random()}` })).duplicate, false);
      }
      await own.stop();
      for (const mem of [new RedisMem(nr), new RedisMem(io)]) {
        await assert.rejects(mem.append("mem:{down}", "user", "after"), (e: unknown) => e instanceof Error && !(e instanceof RedisMemError));
      }
    } finally {
      io.disconnect();
      if (nr.isOpen) nr.destroy();
      await own.stop();
    }
  });
});
