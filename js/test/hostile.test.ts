// The hostile pass's findings on the TypeScript package (issue 24), each as it
// was reproduced against a real server: reply streams as docs/STREAMS.md
// writes them (numbered chunks, one end event, long replies, checked ids,
// recreated streams), the chat store on long chats, odd names and text.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "redis";
import {
  RedisMem, ReplyStream, ReplyStreamGap, saveUIMessages, validEventId, writeUIMessageStream,
} from "../src/index.js";
import { startServer, type Server } from "./server.js";

let server: Server;
let mem: RedisMem;
let other: RedisMem;
let close: () => Promise<void>;
before(async () => {
  server = await startServer();
  const a = createClient({ url: server.url, RESP: 3 });
  const b = createClient({ url: server.url });
  await a.connect(); await b.connect();
  mem = new RedisMem(a); other = new RedisMem(b);
  close = async () => { a.destroy(); b.destroy(); };
});
after(async () => { await close(); await server.stop(); });

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe("reply streams as docs/STREAMS.md writes them", () => {
  it("chunks are numbered and the end counts them; two finishes at once write one end event", async () => {
    for (let round = 0; round < 20; round++) {
      const key = `mem:{race-${round}}`;
      const a = new ReplyStream(mem, key, { replyId: `r${round}` });
      const b = new ReplyStream(other, key, { replyId: `r${round}` });
      await a.write("Hel"); await a.write("lo");
      await b.write("Hel"); await b.write("lo"); // b's object knows the same text
      const [ea, eb] = await Promise.all([a.finish(), b.finish()]);
      assert.equal(ea.id, eb.id, `round ${round}`);
      const evs = await a.read();
      assert.equal(evs.filter((e) => e.type === "end").length, 1, `round ${round}`);
      assert.deepEqual(evs.slice(0, 2).map((e) => e.n), [0, 1]);
      assert.equal(evs.at(-1)!.chunks, 2);
      assert.equal((await mem.get(key)).filter((m) => m.msgId === `r${round}`).length, 1);
    }
  });

  it("a reply over mem.max-message-bytes is stored cut with a marker and the end event written", async () => {
    const key = "mem:{long-reply}";
    const s = new ReplyStream(mem, key, { replyId: "long" });
    for (let i = 0; i < 5; i++) await s.write("x".repeat(1024 * 1024));
    const warn = console.warn;
    const said: string[] = [];
    console.warn = (m: string) => { said.push(m); };
    try {
      const end = await s.finish();
      assert.equal(end.type, "end");
      assert.equal(end.meta!["redis_mem_truncated"], 5 * 1024 * 1024);
    } finally { console.warn = warn; }
    assert.equal(said.length, 1);
    const [m] = await mem.get(key);
    assert.ok(Buffer.byteLength(m!.content) <= 4 * 1024 * 1024);
    assert.match(m!.content, /\n\[redis-mem: truncated to \d+ of 5242880 bytes \(over mem.max-message-bytes\)\]$/);
    assert.equal((await collect(s.chunks())).join("").length, 5 * 1024 * 1024); // the chunks keep it whole
  });

  it("reply ids and event ids are checked before anything is written", async () => {
    for (const bad of ["a\nb", "", "x".repeat(257), "\u0000", "a\ud800"]) {
      assert.throws(() => new ReplyStream(mem, "mem:{ids}", { replyId: bad }), RangeError, JSON.stringify(bad));
    }
    assert.equal(await mem.send(["EXISTS", "mem:{ids}"]), 0);
    assert.equal(validEventId("18446744073709551615-18446744073709551615"), "18446744073709551615-18446744073709551615");
    for (const bad of ["18446744073709551616", "1-18446744073709551616", "99999999999999999999-0"]) {
      assert.throws(() => validEventId(bad), RangeError, bad);
    }
  });

  it("a reader after an event the stream no longer holds, or meeting a chunk out of turn, reports a hole", async () => {
    const key = "mem:{recreated}";
    const s = new ReplyStream(mem, key, { replyId: "rec" });
    const first = await s.write("one ");
    await s.write("two ");
    await mem.send(["DEL", s.streamKey]); // Redis restarted without persistence, or the stream expired
    // A stream made again later numbers its events later: past the first
    // event's millisecond (written within it, "three" took the first's very
    // id, and the reader after it waited for an event that never came).
    const firstMs = Number(first.split("-")[0]);
    while (Date.now() <= firstMs + 1) await new Promise((r) => setTimeout(r, 2));
    await s.write("three ");
    await assert.rejects(collect(new ReplyStream(other, key, { replyId: "rec" }).events(first, { block: 10 })), ReplyStreamGap);
    // from the start: chunk 2 came where 0 was due
    await assert.rejects(collect(new ReplyStream(other, key, { replyId: "rec" }).events("0", { block: 10 })), ReplyStreamGap);
    await s.finish();
    // an intact reply resumes without complaint
    const t = new ReplyStream(mem, key, { replyId: "fine" });
    const ids = [await t.write("a"), await t.write("b"), await t.write("c")];
    await t.finish();
    assert.deepEqual(await collect(new ReplyStream(other, key, { replyId: "fine" }).chunks(ids[0])), ["b", "c"]);
  });

  it("an aborted AI SDK stream is an error event, not a stored answer", async () => {
    const key = "mem:{aborted}";
    const s = new ReplyStream(mem, key, { replyId: "ab" });
    const ev = await writeUIMessageStream(s, [{ type: "text-delta", delta: "The answer is" }, { type: "abort" }]);
    assert.equal(ev.type, "error");
    assert.deepEqual(await mem.get(key), []);
  });
});

describe("the chat store and odd input", () => {
  it("a long chat saved whole every turn keeps its newest messages, in order, once", async () => {
    const key = "mem:{long-chat}";
    const all: { id: string; role: "user" | "assistant"; parts: { type: "text"; text: string }[] }[] = [];
    for (let i = 0; i < 200; i++) {
      all.push({ id: `m${i}`, role: i % 2 ? "assistant" : "user", parts: [{ type: "text", text: `turn ${i}` }] });
      await saveUIMessages(mem, key, all, { maxMsgs: 30 });
    }
    assert.deepEqual((await mem.get(key)).map((m) => m.msgId), all.slice(-30).map((m) => m.id));
  });

  it("a chat whose stored messages all aged out (MAXAGE) is not stored again when saved whole (hostile pass 58 F1)", async () => {
    const key = "mem:{aged-chat}";
    const all: { id: string; role: "user" | "assistant"; parts: { type: "text"; text: string }[] }[] = [];
    for (let i = 0; i < 200; i++) all.push({ id: `m${i}`, role: i % 2 ? "assistant" : "user", parts: [{ type: "text", text: `turn ${i}` }] });
    await saveUIMessages(mem, key, all, { maxAge: 1 });
    await new Promise((done) => setTimeout(done, 1200));
    all.push({ id: "new", role: "user", parts: [{ type: "text", text: "back again" }] });
    // The module remembers the last 128 MSGIDs that left: the 72 before them came back as new.
    assert.deepEqual((await saveUIMessages(mem, key, all, { maxAge: 1 })).map((r) => r.duplicate), [false]);
    assert.deepEqual((await mem.get(key)).map((m) => m.msgId), ["new"]);
    assert.deepEqual(await saveUIMessages(mem, key, all, { maxAge: 1 }), []);
  });

  it("an edited turn (same id, new text) and an answer without an id are stored (hostile pass 59 F4, F5)", async () => {
    const key = "mem:{ui-edit}";
    const t = (id: string, role: "user" | "assistant", text: string) => ({ id, role, parts: [{ type: "text" as const, text }] });
    const warnings: string[] = [];
    const save = (list: ReturnType<typeof t>[]) => saveUIMessages(mem, key, list, {}, { warn: (w) => warnings.push(w) });
    await save([t("u1", "user", "Book Paris"), t("a1", "assistant", "Done: Paris"), t("u2", "user", "for 2 people"),
      t("a2", "assistant", "2 seats booked")]);
    // useChat's sendMessage({ text, messageId: "u2" }) keeps the id and drops what followed
    const edited = [t("u1", "user", "Book Paris"), t("a1", "assistant", "Done: Paris"), t("u2", "user", "for 3 people"),
      t("a3", "assistant", "3 seats booked")];
    assert.deepEqual((await save(edited)).map((r) => r.duplicate), [false, false]);
    assert.deepEqual((await mem.get(key)).map((m) => m.content),
      ["Book Paris", "Done: Paris", "for 2 people", "2 seats booked", "for 3 people", "3 seats booked"]);
    assert.equal(warnings.filter((w) => w.includes("was edited")).length, 1);
    // saved again: nothing new, nothing said again
    assert.deepEqual(await save(edited), []);
    assert.equal(warnings.filter((w) => w.includes("was edited")).length, 1);
    // an answer saved again with more text is the same answer, not an edit; an id the module refuses is hashed
    const k3 = "mem:{ui-grow}";
    const longId = "x".repeat(200);
    await saveUIMessages(mem, k3, [t(longId, "user", "hi"), t("a9", "assistant", "Hel")]);
    assert.deepEqual(await saveUIMessages(mem, k3, [t(longId, "user", "hi"), t("a9", "assistant", "Hello there")]), []);
    assert.deepEqual((await mem.get(k3)).map((m) => m.content), ["hi", "Hel"]);
    // an answer without an id (onFinish without generateMessageId): stored, once
    const k2 = "mem:{ui-noid}";
    const noId = [t("u1", "user", "hi"), t("", "assistant", "hello")];
    assert.deepEqual((await saveUIMessages(mem, k2, noId)).map((r) => r.duplicate), [false, false]);
    assert.deepEqual(await saveUIMessages(mem, k2, noId), []);
    assert.deepEqual((await mem.get(k2)).map((m) => m.content), ["hi", "hello"]);
  });

  it("an attribute named __proto__ is read back as a field; a lone surrogate is stored as U+FFFD, not refused", async () => {
    const key = "mem:{odd}";
    await mem.append(key, "user", "hi");
    await mem.attrSet(key, "__proto__", { x: 1 });
    await mem.attrSet(key, "a", 1);
    const attrs = await mem.attrGet(key);
    assert.deepEqual(Object.keys(attrs).sort(), ["__proto__", "a"]);
    assert.deepEqual(attrs["__proto__"], { x: 1 });
    await mem.appendBatch(key, [{ role: "user", content: "a\ud800b", meta: { note: "c\udfffd" } }]);
    const last = (await mem.get(key)).at(-1)!;
    assert.equal(last.content, "a\ufffdb");
    assert.deepEqual(last.meta, { note: "c\ufffdd" });
  });
});

describe("the AI SDK resume endpoint", () => {
  it("answers 400 to a Last-Event-ID that is not an event id, before reading", async () => {
    const { uiMessageStreamResponse } = await import("../src/index.js");
    const s = new ReplyStream(mem, "mem:{resume-400}", { replyId: "r" });
    for (const bad of ["$", "1-2-3", "18446744073709551616-0", "5\n"]) {
      const res = uiMessageStreamResponse(s, { after: bad });
      assert.equal(res.status, 400, bad);
    }
    await s.write("hi"); await s.finish();
    const ok = uiMessageStreamResponse(s, { after: "0" });
    assert.equal(ok.status, 200);
    assert.match(await ok.text(), /"delta":"hi"/);
  });
});

describe("the chat store when useChat regenerates or edits", () => {
  it("adds the new branch and says that the replaced one stays", async () => {
    const key = "mem:{regen}";
    const ui = (id: string, role: "user" | "assistant", text: string) => ({ id, role, parts: [{ type: "text" as const, text }] });
    const said: string[] = [];
    const warn = (m: string): void => { said.push(m); };
    await saveUIMessages(mem, key, [ui("u1", "user", "hi"), ui("a1", "assistant", "answer A")], {}, { warn });
    assert.deepEqual(said, []);
    await saveUIMessages(mem, key, [ui("u1", "user", "hi"), ui("a1b", "assistant", "answer B")], {}, { warn });
    assert.deepEqual((await mem.get(key)).map((m) => m.msgId), ["u1", "a1", "a1b"]);
    assert.equal(said.length, 1);
    assert.match(said[0]!, /holds 1 message\(s\) the chat no longer has \(a1: a regenerated answer/);
    // the same list again: nothing added, nothing said
    assert.deepEqual(await saveUIMessages(mem, key, [ui("u1", "user", "hi"), ui("a1b", "assistant", "answer B")], {}, { warn }), []);
    assert.equal(said.length, 1);
  });
});
