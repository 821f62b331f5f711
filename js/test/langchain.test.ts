// RedisMemChatMessageHistory (LangChain.js) against a real server, and across
// languages with the Python package's RedisMemChatMessageHistory.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import { RedisMem } from "../src/index.js";
import { RedisMemChatMessageHistory, SUMMARY_SOURCE, msgIdOf } from "../src/langchain.js";
import { CLIENTS, REPO, startServer, type Server } from "./server.js";

let server: Server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

const conversation = (): BaseMessage[] => [
  new SystemMessage({ content: "You are terse.", id: "s1" }),
  new HumanMessage({ content: "Weather in Paris?", id: "h1" }),
  new AIMessage({ content: "", id: "a1", tool_calls: [{ id: "c1", name: "weather", args: { city: "Paris" }, type: "tool_call" }] }),
  new ToolMessage({ content: "22C", tool_call_id: "c1", id: "t1" }),
  new AIMessage({ content: "22C and sunny.", id: "a2" }),
];

const shape = (ms: BaseMessage[]): unknown[] => ms.map((m) => ({
  type: m.getType(), content: m.content, id: m.id,
  ...(m instanceof AIMessage && m.tool_calls?.length ? { tool_calls: m.tool_calls.map(({ id, name, args }) => ({ id, name, args })) } : {}),
  ...(m instanceof ToolMessage ? { tool_call_id: m.tool_call_id } : {}),
}));

for (const kind of CLIENTS) {
  describe(`RedisMemChatMessageHistory on ${kind.name}`, () => {
    let mem: RedisMem;
    let close: () => Promise<void>;
    before(async () => { ({ mem, close } = await kind.open(server.url, server.port)); });
    after(async () => { await close(); });

    it("messages come back equal; a retried add stores nothing twice; the summary first; clear", async () => {
      const key = `mem:{lc-${kind.name.replace(/ /g, "-")}}`;
      const h = new RedisMemChatMessageHistory(mem, key, { maxMsgs: 100 });
      await h.addMessages(conversation());
      assert.deepEqual(shape(await h.getMessages()), shape(conversation()));
      await h.addMessages(conversation()); // a retry: every id known
      assert.deepEqual(h.lastResults.map((r) => r.duplicate), [true, true, true, true, true]);
      await h.addUserMessage("Thanks!");
      await h.addMessage(new ChatMessage({ content: "note", role: "critic" }));
      const all = await h.getMessages();
      assert.equal(all.length, 7);
      assert.equal(all[5]!.getType(), "human");
      assert.equal((all[6] as ChatMessage).role, "critic");
      assert.equal((await mem.get(key))[2]!.meta!["lc_type"], "ai");
      assert.equal((await mem.info(key))!.maxMsgs, 100);

      await mem.summarize(key, 4, "Paris weather asked.");
      const after = await h.getMessages();
      assert.equal(after[0]!.getType(), "human");
      assert.equal(after[0]!.additional_kwargs["lc_source"], SUMMARY_SOURCE);
      assert.match(String(after[0]!.content), /Paris weather asked\.$/);
      assert.equal((await new RedisMemChatMessageHistory(mem, key, { includeSummary: false }).getMessages()).length, 3);
      await h.clear();
      assert.deepEqual(await h.getMessages(), []);
    });
  });
}

describe("msgIdOf", () => {
  it("ids the module refuses are hashed, as in Python", () => {
    assert.equal(msgIdOf(new HumanMessage({ content: "x", id: "ok-1" })), "ok-1");
    assert.equal(msgIdOf(new HumanMessage("x")), undefined);
    assert.equal(msgIdOf(new HumanMessage({ content: "x", id: "a\nb" })),
      `sha256:${createHash("sha256").update("a\nb").digest("hex")}`);
    assert.match(msgIdOf(new HumanMessage({ content: "x", id: "y".repeat(200) }))!, /^sha256:[0-9a-f]{64}$/);
    for (const id of ["a\u2028b", "c1\u0085", "p\u2029"]) {
      assert.equal(msgIdOf(new HumanMessage({ content: "x", id })),
        `sha256:${createHash("sha256").update(id).digest("hex")}`, JSON.stringify(id));
    }
  });
});

const PY = process.env["REDIS_MEM_PYTHON"] ?? join(REPO, "target", "venv", "bin", "python");
describe("across languages (Python's RedisMemChatMessageHistory)", { skip: existsSync(PY) || process.env["REDIS_MEM_REQUIRE_PYTHON"] ? false : `no Python venv at ${PY} (REDIS_MEM_PYTHON)` }, () => {
  const py = async (code: string): Promise<unknown> =>
    JSON.parse((await promisify(execFile)(PY, ["-c", code, String(server.port)])).stdout) as unknown;

  it("Python writes, TypeScript reads; TypeScript writes, Python reads; ids hashed alike", async () => {
    const { mem, close } = await CLIENTS[1]!.open(server.url, server.port);
    try {
      await py(`
import sys, json, redis
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from redis_mem.langchain import RedisMemChatMessageHistory
h = RedisMemChatMessageHistory("mem:{lc-py}", redis.Redis(port=int(sys.argv[1])))
h.add_messages([
    SystemMessage("You are terse.", id="s1"),
    HumanMessage("Weather in Paris?", id="h1"),
    AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "weather", "args": {"city": "Paris"}}]),
    ToolMessage("22C", tool_call_id="c1", id="t1"),
    AIMessage("22C and sunny.", id="a2"),
    HumanMessage("bad id", id="a\\nb"),
])
print("[]")
`);
      const fromPy = await new RedisMemChatMessageHistory(mem, "mem:{lc-py}").getMessages();
      assert.deepEqual(shape(fromPy.slice(0, 5)), shape(conversation()));
      // the same messages added from TypeScript are the ones Python stored: duplicates
      const again = new RedisMemChatMessageHistory(mem, "mem:{lc-py}");
      await again.addMessages([...conversation(), new HumanMessage({ content: "bad id", id: "a\nb" })]);
      assert.deepEqual(again.lastResults.map((r) => r.duplicate), [true, true, true, true, true, true]);

      await new RedisMemChatMessageHistory(mem, "mem:{lc-ts}").addMessages(conversation());
      const got = await py(`
import sys, json, redis
from redis_mem.langchain import RedisMemChatMessageHistory
h = RedisMemChatMessageHistory("mem:{lc-ts}", redis.Redis(port=int(sys.argv[1])))
out = []
for m in h.messages:
    d = {"type": m.type, "content": m.content, "id": m.id}
    if getattr(m, "tool_calls", None):
        d["tool_calls"] = [{"id": c["id"], "name": c["name"], "args": c["args"]} for c in m.tool_calls]
    if m.type == "tool":
        d["tool_call_id"] = m.tool_call_id
    out.append(d)
print(json.dumps(out))
`);
      assert.deepEqual(got, shape(conversation()));
    } finally {
      await close();
    }
  });
});
