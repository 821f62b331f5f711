// RedisMemMiddleware as an agent's memory: two turns of a createAgent agent on one
// thread, the second given the first from Redis (no checkpointer). The model is a
// scripted stand-in so the example runs without an API key: swap in any chat model
// (`new ChatOpenAI({ model: "gpt-4o" })`). Run against `make run`'s server:
// node build-test/examples/agent_middleware.js (REDIS_URL to point elsewhere).
import { createClient } from "redis";
import { createAgent, tool } from "langchain";
import { BaseChatModel } from "@langchain/core/language_models/chat_models";
import { AIMessage, HumanMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import type { ChatResult } from "@langchain/core/outputs";
import { RedisMem } from "redis-mem";
import { RedisMemMiddleware } from "redis-mem/middleware";

/** Calls `weather` for the newest question, then answers with its result, and
 * says how many earlier messages it was given. */
class ScriptedModel extends BaseChatModel {
  _llmType(): string { return "scripted"; }
  bindTools(): this { return this; }
  async _generate(messages: BaseMessage[]): Promise<ChatResult> {
    const last = messages[messages.length - 1]!;
    const reply = last instanceof ToolMessage
      ? new AIMessage(`It is ${last.text} (I was given ${messages.length} messages).`)
      : new AIMessage({ content: "", tool_calls: [{ id: `call-${messages.length}`, name: "weather", args: { city: last.text }, type: "tool_call" }] });
    return { generations: [{ text: reply.text, message: reply }] };
  }
}

const weather = tool(async ({ city }: { city: string }) => `22C in ${city}`, {
  name: "weather",
  description: "The weather in a city",
  schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
});

const redis = createClient({ url: process.env["REDIS_URL"] ?? "redis://localhost:6379" });
await redis.connect();
const thread = `example-${process.pid}`;
const memory = new RedisMemMiddleware(redis, { budget: 8000, maxMsgs: 200 });
const agent = createAgent({ model: new ScriptedModel({}), tools: [weather], middleware: [memory.middleware], systemPrompt: "Be brief." });

for (const [id, city] of [["turn-1", "Paris"], ["turn-2", "Rome"]] as const) {
  const out = await agent.invoke({ messages: [new HumanMessage({ content: city, id })] },
    { configurable: { thread_id: thread } });
  console.log(out.messages[out.messages.length - 1]!.text);
}
const mem = new RedisMem(redis);
const stored = await mem.get(`mem:{${thread}}`);
console.log(stored.map((m) => m.role).join(" "));
await mem.delete(`mem:{${thread}}`);
await redis.quit();
