// The Vercel AI SDK's own pieces on a ReplyStream: a real streamText over the
// SDK's mock model (ai/test) written with writeUIMessageStream, read back by
// useChat's transport (DefaultChatTransport.reconnectToStream, resume's path)
// and readUIMessageStream; a reply a Python agent streamed, resumed the same way.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { DefaultChatTransport, readUIMessageStream, streamText, type UIMessage } from "ai";
import { MockLanguageModelV4, simulateReadableStream } from "ai/test";
import { createClient } from "redis";
import {
  RedisMem, ReplyStream, UI_MESSAGE_STREAM_HEADERS, uiMessageChunks, uiMessageStreamResponse, writeUIMessageStream,
} from "../src/index.js";
import { REPO, startServer, type Server } from "./server.js";

let server: Server;
let mem: RedisMem;
let close: () => Promise<void>;
before(async () => {
  server = await startServer();
  const c = createClient({ url: server.url, RESP: 3 });
  await c.connect();
  mem = new RedisMem(c);
  close = async () => { c.destroy(); };
});
after(async () => { await close(); await server.stop(); });

function model(deltas: string[]): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doStream: {
      stream: simulateReadableStream({
        chunks: [
          { type: "stream-start", warnings: [] },
          { type: "text-start", id: "t1" },
          ...deltas.map((delta) => ({ type: "text-delta" as const, id: "t1", delta })),
          { type: "text-end", id: "t1" },
          {
            type: "finish", finishReason: { unified: "stop", raw: "stop" },
            usage: {
              inputTokens: { total: 3, noCache: 3, cacheRead: 0, cacheWrite: 0 },
              outputTokens: { total: deltas.length, text: deltas.length, reasoning: 0 },
            },
          },
        ],
      }),
    },
  });
}

/** useChat's resume: DefaultChatTransport's GET <api>/<chatId>/stream, answered by `serve`. */
async function resume(serve: (url: string) => Response): Promise<UIMessage> {
  const seen: string[] = [];
  const transport = new DefaultChatTransport({
    api: "http://app.test/api/chat",
    fetch: (async (input: string | URL | Request) => { seen.push(String(input)); return serve(String(input)); }) as typeof fetch,
  });
  const stream = await transport.reconnectToStream({ chatId: "alice" });
  assert.ok(stream);
  assert.deepEqual(seen, ["http://app.test/api/chat/alice/stream"]);
  let last: UIMessage | undefined;
  for await (const m of readUIMessageStream({ stream })) last = m;
  assert.ok(last);
  return last;
}

const textOf = (m: UIMessage): string => m.parts.map((p) => (p.type === "text" ? p.text : "")).join("");

describe("Vercel AI SDK", () => {
  it("streamText -> writeUIMessageStream -> the session; resumed by useChat's transport", async () => {
    const result = streamText({ model: model(["Hello", ", ", "world!"]), prompt: "hi" });
    const reply = new ReplyStream(mem, "mem:{ai-alice}", { replyId: "ai-r1" });
    const end = await writeUIMessageStream(reply, result.toUIMessageStream(), { meta: { via: "ai-sdk" } });
    assert.equal(end.type, "end");
    assert.equal(end.messageId, 1);
    const [m] = await mem.get("mem:{ai-alice}");
    assert.deepEqual([m!.role, m!.content, m!.msgId, m!.meta], ["assistant", "Hello, world!", "ai-r1", { via: "ai-sdk" }]);

    const res = uiMessageStreamResponse(new ReplyStream(mem, "mem:{ai-alice}", { replyId: "ai-r1" }));
    for (const [k, v] of Object.entries(UI_MESSAGE_STREAM_HEADERS)) assert.equal(res.headers.get(k), v);
    const ui = await resume(() => res);
    assert.equal(ui.id, "ai-r1");
    assert.equal(ui.role, "assistant");
    assert.equal(textOf(ui), "Hello, world!");
  });

  it("the SSE body: an id per event (Last-Event-ID), [DONE] last; resuming after an id", async () => {
    const reply = new ReplyStream(mem, "mem:{ai-bob}", { replyId: "ai-r2" });
    const ids = [await reply.write("one "), await reply.write("two")];
    await reply.finish();
    const body = await uiMessageStreamResponse(new ReplyStream(mem, "mem:{ai-bob}", { replyId: "ai-r2" })).text();
    const events = body.trim().split("\n\n");
    assert.equal(events.at(-1), "data: [DONE]");
    assert.equal(events[0], 'data: {"type":"start","messageId":"ai-r2"}');
    assert.equal(events[2], `id: ${ids[0]}\ndata: {"type":"text-delta","id":"ai-r2","delta":"one "}`);
    const rest = [];
    for await (const { chunk } of uiMessageChunks(new ReplyStream(mem, "mem:{ai-bob}", { replyId: "ai-r2" }), ids[0])) rest.push(chunk);
    assert.deepEqual(rest.map((c) => c.type), ["start", "text-start", "text-delta", "text-end", "finish"]);
  });

  it("a model error ends the reply with an error event; nothing stored", async () => {
    const failing = new MockLanguageModelV4({
      doStream: {
        stream: simulateReadableStream({
          chunks: [
            { type: "stream-start", warnings: [] }, { type: "text-start", id: "t1" },
            { type: "text-delta", id: "t1", delta: "par" }, { type: "error", error: new Error("rate limited") },
          ],
        }),
      },
    });
    const result = streamText({ model: failing, prompt: "hi", onError: () => {} });
    const reply = new ReplyStream(mem, "mem:{ai-err}", { replyId: "ai-r3" });
    const end = await writeUIMessageStream(reply, result.toUIMessageStream({ onError: (e) => (e as Error).message }));
    assert.deepEqual([end.type, end.text], ["error", "rate limited"]);
    assert.deepEqual(await mem.get("mem:{ai-err}"), []);
    const chunks = [];
    for await (const { chunk } of uiMessageChunks(new ReplyStream(mem, "mem:{ai-err}", { replyId: "ai-r3" }))) chunks.push(chunk);
    assert.deepEqual(chunks.map((c) => c.type), ["start", "text-start", "text-delta", "error"]);
    assert.deepEqual(chunks.at(-1), { type: "error", errorText: "rate limited" });
    // a plain array of chunks works too
    const r2 = new ReplyStream(mem, "mem:{ai-err}", { replyId: "ai-r4" });
    assert.equal((await writeUIMessageStream(r2, [{ type: "text-delta", delta: "ok" }, { type: "finish" }])).type, "end");
    assert.equal((await mem.get("mem:{ai-err}"))[0]!.content, "ok");
  });

  const PY = process.env["REDIS_MEM_PYTHON"] ?? join(REPO, "target", "venv", "bin", "python");
  it("a reply a Python agent streamed, resumed by useChat's transport", { skip: existsSync(PY) || process.env["REDIS_MEM_REQUIRE_PYTHON"] ? false : `no Python venv at ${PY} (REDIS_MEM_PYTHON)` }, async () => {
    const { stdout } = await promisify(execFile)(PY, ["-c", `
import sys, redis
from redis_mem import ReplyStream
s = ReplyStream(redis.Redis(port=int(sys.argv[1])), "mem:{ai-py}")
for t in ["Streamed ", "by ", "Python."]:
    s.write(t)
s.finish()
print(s.reply_id)
`, String(server.port)]);
    const replyId = stdout.trim();
    const ui = await resume(() => uiMessageStreamResponse(new ReplyStream(mem, "mem:{ai-py}", { replyId })));
    assert.equal(ui.id, replyId);
    assert.equal(textOf(ui), "Streamed by Python.");
  });
});

describe("examples/ai_sdk_chat.ts (useChat's POST and resume GET)", () => {
  it("a chat turn; the connection dropped mid-reply; resumed; each turn stored once", async () => {
    const { chatRoutes } = await import("../examples/ai_sdk_chat.js");
    const c2 = createClient({ url: server.url, RESP: 3 });
    await c2.connect();
    try {
      const slow = new MockLanguageModelV4({
        doStream: async () => ({
          stream: simulateReadableStream({
            chunkDelayInMs: 40,
            chunks: [
              { type: "stream-start", warnings: [] }, { type: "text-start", id: "t1" },
              ...["The ", "8pm ", "table ", "is ", "booked."].map((delta) => ({ type: "text-delta" as const, id: "t1", delta })),
              { type: "text-end", id: "t1" },
              {
                type: "finish", finishReason: { unified: "stop", raw: "stop" },
                usage: { inputTokens: { total: 3, noCache: 3, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 5, text: 5, reasoning: 0 } },
              },
            ],
          }),
        }),
      });
      const routes = chatRoutes({ mem, reader: new RedisMem(c2), model: slow });
      const transport = new DefaultChatTransport({
        api: "http://app.test/api/chat",
        fetch: (async (input: string | URL | Request, init?: RequestInit) => {
          const url = String(input);
          const m = /\/api\/chat\/([^/]+)\/stream$/.exec(url);
          return m ? routes.GET(new Request(url), m[1]!) : routes.POST(new Request(url, init));
        }) as typeof fetch,
      });
      assert.equal((await routes.GET(new Request("http://app.test/"), "carol")).status, 204);
      const user: UIMessage = { id: "u-1", role: "user", parts: [{ type: "text", text: "Book the 8pm table" }] };
      const stream = await transport.sendMessages({
        trigger: "submit-message", chatId: "carol", messageId: undefined, messages: [user], abortSignal: undefined,
      });
      // the page reloads after the first words: the stream is dropped
      const r = stream.getReader();
      let got = "";
      while (!got.includes("8pm")) {
        const { value } = await r.read();
        if (value?.type === "text-delta") got += value.delta;
      }
      await r.cancel();
      // useChat's resume, on mount
      const resumed = await transport.reconnectToStream({ chatId: "carol" });
      assert.ok(resumed, "a reply is in flight");
      let last: UIMessage | undefined;
      for await (const m of readUIMessageStream({ stream: resumed })) last = m;
      assert.equal(textOf(last!), "The 8pm table is booked.");
      await Promise.all([...routes.pending]);
      assert.equal(await transport.reconnectToStream({ chatId: "carol" }), null); // done: 204
      const session = await mem.get("mem:{carol}");
      assert.deepEqual(session.map((m) => [m.role, m.content, m.msgId]), [
        ["user", "Book the 8pm table", "u-1"], ["assistant", "The 8pm table is booked.", last!.id],
      ]);
      // the same user message sent again (a retry) is not stored twice
      const again = await transport.sendMessages({
        trigger: "submit-message", chatId: "carol", messageId: undefined, messages: [user], abortSignal: undefined,
      });
      for await (const _ of readUIMessageStream({ stream: again })) { /* drain */ }
      await Promise.all([...routes.pending]);
      assert.deepEqual((await mem.get("mem:{carol}")).map((m) => m.role), ["user", "assistant", "assistant"]);
    } finally {
      c2.destroy();
    }
  });
});

describe("chat store (UIMessages)", () => {
  it("saved once by id however often the whole list is saved; loaded as valid UIMessages", async () => {
    const { loadUIMessages, saveUIMessages } = await import("../src/index.js");
    const { validateUIMessages } = await import("ai");
    const key = "mem:{ui-store}";
    const u1: UIMessage = { id: "u1", role: "user", parts: [{ type: "text", text: "Plan a trip to Rome." }] };
    const a1: UIMessage = { id: "a1", role: "assistant", parts: [{ type: "step-start" }, { type: "text", text: "Day 1: " }, { type: "text", text: "the Colosseum." }] };
    const u2: UIMessage = { id: "u2", role: "user", parts: [{ type: "text", text: "And day 2?" }] };
    assert.deepEqual((await saveUIMessages(mem, key, [u1, a1])).map((r) => r.duplicate), [false, false]);
    // only what follows the newest message held is sent
    assert.deepEqual((await saveUIMessages(mem, key, [u1, a1, u2])).map((r) => r.duplicate), [false]);
    const loaded = await loadUIMessages(mem, key);
    assert.deepEqual(loaded.map((m) => [m.id, m.role, m.parts]), [
      ["u1", "user", [{ type: "text", text: "Plan a trip to Rome." }]],
      ["a1", "assistant", [{ type: "text", text: "Day 1: the Colosseum." }]],
      ["u2", "user", [{ type: "text", text: "And day 2?" }]],
    ]);
    assert.equal(typeof loaded[0]!.metadata!.ts, "number");
    assert.equal((await validateUIMessages({ messages: loaded })).length, 3);
    // a summary comes back first, as a system message the next save skips
    const upto = (await mem.get(key))[1]!.id;
    await mem.summarize(key, upto, "Rome trip, day 1 planned.");
    const after = await loadUIMessages(mem, key);
    assert.deepEqual(after.map((m) => [m.id, m.role, m.metadata?.summary]), [[`summary-${upto}`, "system", true], ["u2", "user", undefined]]);
    assert.deepEqual(await saveUIMessages(mem, key, after), []);
    // useChat's whole list again stores nothing (u2 is held: nothing follows it)
    assert.deepEqual(await saveUIMessages(mem, key, [u1, a1, u2]), []);
    assert.equal((await mem.get(key)).length, 2);
  });
});
