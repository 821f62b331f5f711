// RedisMemMiddleware in a real createAgent loop (langchain 1.x) over a
// fake chat model that calls a tool, against a real server with the module.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createClient } from "redis";
import { createAgent, tool } from "langchain";
import { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { AIMessage, HumanMessage, SystemMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import type { ChatResult } from "@langchain/core/outputs";
import { RedisMem } from "../src/index.js";
import { RedisMemMiddleware, SUMMARY_PROMPT } from "../src/middleware.js";
import { startServer, type Server } from "./server.js";

/** A chat model that calls `weather` once per question, then answers; it
 * writes summaries when given the summary prompt; every call's messages are kept. */
class FakeToolModel extends BaseChatModel {
  calls: BaseMessage[][] = [];
  failures = 0;
  _llmType(): string { return "fake-tool-model"; }
  bindTools(): this { return this; }
  async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    this.calls.push(messages);
    if (this.failures > 0) { this.failures--; throw new Error("provider error (fake)"); }
    const last = messages[messages.length - 1]!;
    let reply: AIMessage;
    if (messages[0] instanceof SystemMessage && messages[0].text === SUMMARY_PROMPT) {
      reply = new AIMessage(`SUMMARY of ${last.text.split("\n").length - 1} lines`);
    } else if (last instanceof ToolMessage) {
      reply = new AIMessage(`It is ${last.text}.`);
    } else {
      const n = this.calls.length;
      reply = new AIMessage({ content: "", tool_calls: [{ id: `call${n}`, name: "weather", args: { city: last.text }, type: "tool_call" }] });
    }
    return { generations: [{ text: reply.text, message: reply }] };
  }
}

const weather = tool(async (input: { city: string }) => `22C in ${input.city}`, {
  name: "weather",
  description: "The weather in a city",
  schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
});

/** The conversation part of a model call (no system message). */
const convo = (ms: BaseMessage[]): BaseMessage[] => ms.filter((m) => !(m instanceof SystemMessage));

let server: Server;
let client: ReturnType<typeof createClient>;
let mem: RedisMem;
before(async () => {
  server = await startServer();
  client = createClient({ url: server.url });
  await client.connect();
  mem = new RedisMem(client);
});
after(async () => { client.destroy(); await server.stop(); });

function agentOf(model: FakeToolModel, memory: RedisMemMiddleware) {
  return createAgent({ model, tools: [weather], middleware: [memory.middleware], systemPrompt: "You are terse." });
}

describe("RedisMemMiddleware", () => {
  it("stores the user's message, the call, its result and the answer, keyed by the thread id", async () => {
    const model = new FakeToolModel({});
    const memory = new RedisMemMiddleware(client, { maxMsgs: 100 });
    const out = await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Paris", id: "u1" })] },
      { configurable: { thread_id: "t1" } });
    assert.equal(out.messages[out.messages.length - 1]!.text, "It is 22C in Paris.");
    const stored = await mem.get("mem:{t1}");
    assert.deepEqual(stored.map((e) => [e.role, e.content]), [
      ["user", "Paris"], ["assistant", ""], ["tool", "22C in Paris"], ["assistant", "It is 22C in Paris."]]);
    assert.equal(stored[0]!.msgId, "u1");
    const calls = stored[1]!.meta!["tool_calls"] as { id: string; name: string; args: unknown }[];
    assert.deepEqual(calls.map(({ id, name, args }) => ({ id, name, args })), [{ id: "call1", name: "weather", args: { city: "Paris" } }]);
    assert.equal(stored[2]!.meta!["tool_call_id"], "call1");
    // the second model call was given the context from Redis: user, call, result
    assert.deepEqual(convo(model.calls[1]!).map((m) => m.getType()), ["human", "ai", "tool"]);

    // a second turn: the model is given the first turn from Redis (no checkpointer)
    await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Rome", id: "u2" })] },
      { configurable: { thread_id: "t1" } });
    assert.deepEqual(convo(model.calls[2]!).map((m) => m.text), ["Paris", "", "22C in Paris", "It is 22C in Paris.", "Rome"]);
    assert.equal((await mem.get("mem:{t1}")).length, 8);
    // a custom key
    const custom = new RedisMemMiddleware(client, { key: (t) => `chat:{${t}}` });
    await agentOf(new FakeToolModel({}), custom).invoke({ messages: [new HumanMessage({ content: "Oslo", id: "u3" })] },
      { configurable: { thread_id: "t2" } });
    assert.equal((await mem.get("chat:{t2}")).length, 4);
  });

  it("a retried step stores nothing twice (the message ids are the MSGIDs)", async () => {
    const failing = new FakeToolModel({});
    failing.failures = 1;
    const input = { messages: [new HumanMessage({ content: "Lima", id: "r1" })] };
    const config = { configurable: { thread_id: "retry" } };
    await assert.rejects(agentOf(failing, new RedisMemMiddleware(client)).invoke(input, config), /provider error/);
    assert.deepEqual((await mem.get("mem:{retry}")).map((e) => e.msgId), ["r1"]);
    // the retry, by another worker (another middleware: nothing cached)
    const memory = new RedisMemMiddleware(client);
    const spied: boolean[][] = [];
    const orig = memory.mem.appendBatch.bind(memory.mem);
    memory.mem.appendBatch = async (...a) => { const r = await orig(...a); spied.push(r.map((x) => x.duplicate)); return r; };
    await agentOf(new FakeToolModel({}), memory).invoke(input, config);
    assert.deepEqual(spied[0], [true]);
    // and the whole run again: every message known
    const again = new RedisMemMiddleware(client);
    const model = new FakeToolModel({});
    const run = await agentOf(model, again).invoke(input, config);
    const stored = await mem.get("mem:{retry}");
    assert.equal(stored.filter((e) => e.msgId === "r1").length, 1);
    assert.equal(stored.length, 4 + (run.messages.length - 1)); // the second run's own call/result/answer are new messages
  });

  it("a new process given a long thread stores only what follows the newest message the session holds or let go (hostile pass 58 F1)", async () => {
    const config = { configurable: { thread_id: "aged" } };
    const history: BaseMessage[] = [];
    for (let i = 0; i < 100; i++) {
      history.push(new HumanMessage({ content: `q${i}`, id: `q${i}` }), new AIMessage({ content: `a${i}`, id: `a${i}` }));
    }
    const settings = { maxAge: 1, maxMsgs: 5000, maxTokens: 1_000_000 };
    await agentOf(new FakeToolModel({}), new RedisMemMiddleware(client, settings)).invoke({ messages: history }, config);
    assert.equal((await mem.get("mem:{aged}")).length, 203); // the thread, the call, its result, the answer
    // Two visits, each by a new process (a new middleware) given the whole thread again, as a checkpointer
    // would, once all of it is past MAXAGE: the first write lets the aged messages go, the second found
    // only the last 128 of their MSGIDs and stored the 75 before them again, as new.
    for (const city of ["Oslo", "Lima"]) {
      await new Promise((done) => setTimeout(done, 1200));
      const out = await agentOf(new FakeToolModel({}), new RedisMemMiddleware(client, settings)).invoke(
        { messages: [...history, new HumanMessage({ content: city, id: city })] }, config);
      assert.equal(out.messages[out.messages.length - 1]!.text, `It is 22C in ${city}.`);
      assert.deepEqual((await mem.get("mem:{aged}")).map((e) => e.content), [city, "", `22C in ${city}`, `It is 22C in ${city}.`]);
    }
  });

  it("a new question under a reused id is stored and answered, and said (hostile pass 58 F2)", async () => {
    const warnings: string[] = [];
    const memory = new RedisMemMiddleware(client, { warn: (w) => warnings.push(w) });
    const config = { configurable: { thread_id: "reuse" } };
    const ask = (city: string) => agentOf(new FakeToolModel({}), memory)
      .invoke({ messages: [new HumanMessage({ content: city, id: "msg-1" })] }, config);
    await ask("Paris");
    const out = await ask("Rome");
    assert.equal(out.messages[out.messages.length - 1]!.text, "It is 22C in Rome.");
    // Rome again under the same id: a retry of the second question, not stored again.
    await ask("Rome");
    const stored = await mem.get("mem:{reuse}");
    assert.deepEqual(stored.filter((e) => e.role === "user").map((e) => e.content), ["Paris", "Rome"]);
    assert.equal(warnings.filter((w) => w.includes("is stored with another text")).length, 1);
  });

  it("a new process's first sight stores an edited turn (same id, new text) (hostile pass 59 F1)", async () => {
    const config = { configurable: { thread_id: "edit" } };
    const first = new RedisMemMiddleware(client);
    await agentOf(new FakeToolModel({}), first).invoke({ messages: [new HumanMessage({ content: "Paris", id: "e1" })] }, config);
    await agentOf(new FakeToolModel({}), first).invoke({ messages: [new HumanMessage({ content: "Rome", id: "e2" })] }, config);
    const warnings: string[] = [];
    const fresh = new RedisMemMiddleware(client, { warn: (w) => warnings.push(w) });
    const out = await agentOf(new FakeToolModel({}), fresh).invoke({ messages: [
      new HumanMessage({ content: "Paris", id: "e1" }), new HumanMessage({ content: "Lima", id: "e2" })] }, config);
    assert.equal(out.messages[out.messages.length - 1]!.text, "It is 22C in Lima.");
    const users = (await mem.get("mem:{edit}")).filter((e) => e.role === "user");
    assert.deepEqual(users.map((e) => e.content), ["Paris", "Rome", "Lima"]);
    assert.match(users[2]!.msgId!, /^e2~[0-9a-f]{16}$/);
    assert.equal(warnings.filter((w) => w.includes("stored with another text")).length, 1);
  });

  it("under a constant id, a text asked again after another one is stored; the same text at once is a retry (hostile pass 60 F3)", async () => {
    const memory = new RedisMemMiddleware(client, { warn: () => {} });
    for (const city of ["Paris", "Rome", "Paris", "Paris"]) {
      await agentOf(new FakeToolModel({}), memory).invoke({ messages: [new HumanMessage({ content: city, id: "msg-1" })] },
        { configurable: { thread_id: "const" } });
    }
    const users = (await mem.get("mem:{const}")).filter((e) => e.role === "user");
    assert.deepEqual(users.map((e) => e.content), ["Paris", "Rome", "Paris"]);
    assert.equal(new Set(users.map((e) => e.msgId)).size, 3);
  });

  it("threads sharing one sessionId are each seen first by a new process (hostile pass 59 F3)", async () => {
    const settings = { sessionId: "mem:{user42}", maxMsgs: 10 };
    let state: BaseMessage[] = [];
    const first = new RedisMemMiddleware(client, settings);
    for (let i = 0; i < 40; i++) {
      state = (await agentOf(new FakeToolModel({}), first).invoke(
        { messages: [...state, new HumanMessage({ content: `c${i}`, id: `t2q${i}` })] }, { configurable: { thread_id: "t2" } })).messages;
    }
    const lastId = async () => (await mem.info("mem:{user42}"))!.lastId;
    assert.equal(await lastId(), 160); // 40 turns of question, call, result, answer
    const fresh = new RedisMemMiddleware(client, settings);
    await agentOf(new FakeToolModel({}), fresh).invoke({ messages: [new HumanMessage({ content: "t1 hello", id: "t1q0" })] },
      { configurable: { thread_id: "t1" } });
    await agentOf(new FakeToolModel({}), fresh).invoke({ messages: [...state, new HumanMessage({ content: "Oslo", id: "t2q40" })] },
      { configurable: { thread_id: "t2" } });
    assert.equal(await lastId(), 168);
  });

  it("gives the model MEM.GET BUDGET: the newest messages that fit, tool pairs kept", async () => {
    const key = "mem:{budget}";
    const old = [];
    for (let i = 0; i < 20; i++) {
      old.push({ role: "user", content: `question ${i} `.repeat(10), msgId: `q${i}` });
      old.push({ role: "assistant", content: `answer ${i} `.repeat(10), msgId: `a${i}` });
    }
    await mem.appendBatch(key, old, { maxMsgs: 200 });
    const model = new FakeToolModel({});
    const memory = new RedisMemMiddleware(client, { budget: 300, memory: "window" });
    await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Kyiv", id: "b1" })] },
      { configurable: { thread_id: "budget" } });
    const given = convo(model.calls[1]!);
    const stored = (await mem.get(key)).slice(0, -1); // the final answer came after
    assert.ok(given.length < 20, `given ${given.length} messages`);
    const window = stored.slice(-given.length);
    assert.deepEqual(given.map((m) => m.text), window.map((e) => e.content));
    const tokens = window.reduce((n, e) => n + e.tokens, 0);
    // the newest that fit, less an answer cut loose from its question at the start
    const before = stored.slice(-given.length - 2, -given.length).reduce((n, e) => n + e.tokens, 0);
    assert.ok(tokens <= 300 && tokens + before > 300, `${tokens} tokens`);
    assert.equal(given[0]!.getType(), "human");
    assert.deepEqual(given.slice(-3).map((m) => m.getType()), ["human", "ai", "tool"]);
    assert.equal(given[0]!.getType() === "tool", false);
  });

  it("summarizes under a lease with the agent's own model when the threshold is met", async () => {
    const model = new FakeToolModel({});
    const memory = new RedisMemMiddleware(client, { maxMsgs: 6, keep: 2 });
    const config = { configurable: { thread_id: "sum" } };
    for (const [i, city] of ["Bern", "Vaduz", "Riga"].entries()) {
      await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: city, id: `s${i}` })] }, config);
    }
    const summaryCalls = model.calls.filter((c) => c[0] instanceof SystemMessage && c[0].text === SUMMARY_PROMPT);
    assert.ok(summaryCalls.length >= 1);
    const stored = await mem.get("mem:{sum}");
    assert.ok(stored[0]!.isSummary);
    assert.match(stored[0]!.content, /^SUMMARY of \d+ lines$/);
    // the model is then given the summary first
    const last = convo(model.calls[model.calls.length - 1]!);
    assert.match(last[0]!.text, /summary of the conversation to date:\n\nSUMMARY/);

    // another worker holds the lease: no summary is written
    const key = "mem:{leased}";
    await mem.appendBatch(key, [1, 2, 3, 4, 5].map((i) => ({ role: "user", content: `m${i}` })), { maxMsgs: 6 });
    const held = await mem.summarizeBegin(key, 60000, { keep: 2 });
    assert.ok(held.lease > 0);
    const m2 = new FakeToolModel({});
    await agentOf(m2, new RedisMemMiddleware(client, { maxMsgs: 6, keep: 2 })).invoke(
      { messages: [new HumanMessage({ content: "Oslo", id: "l1" })] }, { configurable: { thread_id: "leased" } });
    assert.equal(m2.calls.filter((c) => c[0] instanceof SystemMessage && c[0].text === SUMMARY_PROMPT).length, 0);
    assert.equal((await mem.get(key)).some((e) => e.isSummary), false);
  });

  it("keeps answering from the local window when Redis stops mid-conversation", async () => {
    const own = await startServer();
    const c = createClient({ url: own.url, disableOfflineQueue: true, socket: { reconnectStrategy: () => 200 } });
    c.on("error", () => {});
    await c.connect();
    const warnings: string[] = [];
    const memory = new RedisMemMiddleware(c, { timeoutMs: 1000, warn: (m) => warnings.push(m) });
    const model = new FakeToolModel({});
    const config = { configurable: { thread_id: "down" } };
    let back: Server | undefined;
    try {
      await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Paris", id: "d1" })] }, config);
      assert.equal((await memory.mem.get("mem:{down}")).length, 4);
      await own.stop();
      const out = await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Rome", id: "d2" })] }, config);
      assert.equal(out.messages[out.messages.length - 1]!.text, "It is 22C in Rome.");
      assert.equal(warnings.length, 1);
      assert.match(warnings[0]!, /WARNING Redis is unreachable.*process-local/);
      // the model was given the conversation from the local window
      const given = convo(model.calls[model.calls.length - 1]!).map((m) => m.text);
      assert.deepEqual(given, ["Paris", "", "22C in Paris", "It is 22C in Paris.", "Rome", "", "22C in Rome"]);

      // Redis is back (empty: no persistence): what was not stored is written back, in order, once
      back = await startServer([], own.port);
      for (let t = 0; !c.isReady; t++) { assert.ok(t < 100, "no reconnect"); await new Promise((ok) => setTimeout(ok, 50)); }
      await agentOf(model, memory).invoke({ messages: [new HumanMessage({ content: "Oslo", id: "d3" })] }, config);
      assert.match(warnings[1]!, /Redis answers again/);
      const stored = await memory.mem.get("mem:{down}");
      assert.deepEqual(stored.filter((e) => e.role === "user").map((e) => e.content), ["Rome", "Oslo"]);
      assert.equal(stored.length, 8);
    } finally {
      c.destroy();
      await own.stop();
      await back?.stop();
    }
  });
  it("stores a tool result over mem.max-message-bytes or a quarter of the token cap truncated with a marker; the model is given all of it", async () => {
    const huge = "lorem ipsum dolor sit amet, ".repeat(200_000) + "é"; // 5.6 MB
    const big = tool(async () => huge, {
      name: "weather", description: "A huge result",
      schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    });
    const size = Buffer.byteLength(huge);
    for (const [thread, maxTokens, marker] of [
      ["huge-bytes", 10_000_000, new RegExp(`\\n\\[redis-mem: truncated to \\d+ of ${size} bytes \\(over mem.max-message-bytes\\)\\]$`)],
      ["huge-tokens", undefined, new RegExp(`\\n\\[redis-mem: truncated to \\d+ of ${size} bytes \\(over 20000 tokens a message\\)\\]$`)],
    ] as const) {
      await mem.append(`mem:{${thread}}`, "user", "an earlier question", { msgId: "old" });
      const warnings: string[] = [];
      const model = new FakeToolModel({});
      const memory = new RedisMemMiddleware(client, { maxMsgs: 100, ...(maxTokens ? { maxTokens } : {}), warn: (m) => warnings.push(m) });
      const out = await createAgent({ model, tools: [big], middleware: [memory.middleware] })
        .invoke({ messages: [new HumanMessage({ content: "Oslo", id: "h1" })] }, { configurable: { thread_id: thread } });
      assert.equal(out.messages.length, 4);
      assert.equal(model.calls[1]!.at(-1)!.text, huge, thread); // given whole
      const stored = await mem.get(`mem:{${thread}}`);
      assert.deepEqual(stored.map((e) => e.role), ["user", "user", "assistant", "tool", "assistant"], thread);
      const result = stored[3]!;
      assert.ok(Buffer.byteLength(result.content) <= 4 * 1024 * 1024);
      assert.match(result.content, marker);
      assert.ok(result.tokens <= (maxTokens ?? 80_000) / 4, `${thread}: ${result.tokens} tokens`);
      assert.equal(result.meta!["redis_mem_truncated"], size);
      assert.equal(result.meta!["tool_call_id"], "call1");
      // the tool's result and the answer that quotes it
      assert.deepEqual([...new Set(warnings.filter((w) => w.includes("stored truncated")).map((w) => w.split(" message")[0]))],
        ["redis-mem: a tool", "redis-mem: a assistant"], `${thread}: ${warnings.join(" | ")}`);
    }
  });

  it("stores 1,200 messages given at once in batches the module takes, in order, once", async () => {
    const history = [];
    for (let i = 0; i < 600; i++) {
      history.push(new HumanMessage({ content: `question ${i}`, id: `m${i}q` }));
      history.push(new AIMessage({ content: `answer ${i}`, id: `m${i}a` }));
    }
    history.push(new HumanMessage({ content: "Lima", id: "last" }));
    const memory = new RedisMemMiddleware(client, { maxMsgs: 5000, maxTokens: 10_000_000 });
    await agentOf(new FakeToolModel({}), memory).invoke({ messages: history }, { configurable: { thread_id: "many" } });
    const stored = await mem.get("mem:{many}");
    assert.equal(stored.length, 1201 + 3);
    assert.deepEqual(stored.slice(0, 1201).map((e) => e.msgId), history.map((m) => m.id));
    // again, from another process: nothing twice
    await agentOf(new FakeToolModel({}), new RedisMemMiddleware(client, { maxMsgs: 5000, maxTokens: 10_000_000 }))
      .invoke({ messages: history }, { configurable: { thread_id: "many" } });
    assert.equal((await mem.get("mem:{many}")).filter((e) => e.msgId === "m0q").length, 1);
  });
});
