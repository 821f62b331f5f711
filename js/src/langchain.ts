// LangChain.js: a BaseListChatMessageHistory on a redis-mem session (the
// chat histories of LangChain.js stacks: n8n's and Flowise's memory nodes),
// storing messages as the Python package's langchain integration does
// (redis_mem/messages.py), so either language reads what the other wrote.
// Entry point `redis-mem/langchain`; needs @langchain/core.
import { createHash } from "node:crypto";
import { BaseListChatMessageHistory } from "@langchain/core/chat_history";
import {
  AIMessage, type BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage,
} from "@langchain/core/messages";
import type { AnyClient } from "./adapter.js";
import { MAX_MSGID_BYTES, NAME_BREAKER, RedisMem, type SessionSettings } from "./client.js";
import type { AppendResult, JsonObject, Message } from "./replies.js";

/** Text put before the stored summary (LangChain's SummarizationMiddleware wording). */
export const DEFAULT_SUMMARY_PREFIX = "Here is a summary of the conversation to date:\n\n";
/** additional_kwargs `lc_source` of the summary message. */
export const SUMMARY_SOURCE = "summarization";

const ROLE_OF_TYPE: Record<string, string> = { human: "user", ai: "assistant", tool: "tool", system: "system", function: "function" };
const TYPE_OF_ROLE: Record<string, string> = Object.fromEntries(Object.entries(ROLE_OF_TYPE).map(([k, v]) => [v, k]));
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const MAX_ROLE_BYTES = 64;

function isName(text: string, maxBytes: number): boolean {
  const raw = Buffer.from(text, "utf8");
  return raw.length > 0 && raw.length <= maxBytes && !NAME_BREAKER.test(text);
}

function empty(v: unknown): boolean {
  return v === undefined || v === null || v === "" || (Array.isArray(v) && v.length === 0)
    || (typeof v === "object" && !Array.isArray(v) && Object.keys(v as object).length === 0);
}

/** LangChain's type name of a message, as Python names it ("chat" for a ChatMessage). */
function lcType(msg: BaseMessage): string {
  const t = msg.getType();
  return t === "generic" ? "chat" : t;
}

/** (role, content, meta) for MEM.APPEND, as redis_mem.messages.message_to_mem makes them. */
export function messageToMem(msg: BaseMessage): { role: string; content: string; meta: JsonObject } {
  const type = lcType(msg);
  const meta: JsonObject = { lc_type: type };
  const m = msg as BaseMessage & Record<string, unknown>;
  for (const k of ["additional_kwargs", "response_metadata", "name", "id", "tool_calls", "invalid_tool_calls",
    "usage_metadata", "tool_call_id", "artifact", "status"]) {
    if (!empty(m[k])) meta[k] = m[k];
  }
  let role = ROLE_OF_TYPE[type] ?? type;
  if (msg instanceof ChatMessage) {
    if (isName(msg.role, MAX_ROLE_BYTES)) role = msg.role;
    else { role = "chat"; meta["role"] = msg.role; }
  }
  let content: string;
  if (typeof msg.content === "string") {
    content = msg.content;
  } else {
    meta["lc_content"] = msg.content as unknown as JsonObject;
    content = msg.text;
  }
  return { role, content, meta: JSON.parse(JSON.stringify(meta)) as JsonObject };
}

/** The MSGID of a LangChain message: its id, hashed when the module would
 * refuse it; undefined when it has none (a fresh one is then made up). */
export function msgIdOf(msg: BaseMessage): string | undefined {
  const id = msg.id;
  if (!id) return undefined;
  if (LONE_SURROGATE.test(id) || !isName(id, MAX_MSGID_BYTES)) {
    return "sha256:" + createHash("sha256").update(id, "utf8").digest("hex");
  }
  return id;
}

/** A stored MEM.GET entry back as a LangChain message (message_from_mem). */
export function messageFromMem(e: Message): BaseMessage {
  const meta: JsonObject = { ...(e.meta ?? {}) };
  const type = (meta["lc_type"] as string | undefined) ?? TYPE_OF_ROLE[e.role] ?? "chat";
  delete meta["lc_type"];
  const content = ("lc_content" in meta ? meta["lc_content"] : e.content) as string;
  delete meta["lc_content"];
  const known: Record<string, string[]> = {
    human: ["id", "name", "additional_kwargs", "response_metadata"],
    system: ["id", "name", "additional_kwargs", "response_metadata"],
    ai: ["id", "name", "additional_kwargs", "response_metadata", "tool_calls", "invalid_tool_calls", "usage_metadata"],
    tool: ["id", "name", "additional_kwargs", "response_metadata", "tool_call_id", "artifact", "status"],
    chat: ["id", "name", "additional_kwargs", "response_metadata", "role"],
  };
  const fields = known[type] ?? known["chat"]!;
  const data: Record<string, unknown> = { content };
  const extra: JsonObject = {};
  for (const [k, v] of Object.entries(meta)) (fields.includes(k) ? data : extra)[k] = v;
  if (Object.keys(extra).length) data["additional_kwargs"] = { ...extra, ...((data["additional_kwargs"] as JsonObject) ?? {}) };
  switch (type) {
    case "human": return new HumanMessage(data as never);
    case "system": return new SystemMessage(data as never);
    case "ai": return new AIMessage(data as never);
    case "tool":
      if (typeof data["tool_call_id"] === "string") return new ToolMessage(data as never);
      return new ChatMessage({ content: e.content, role: e.role, additional_kwargs: e.meta ?? {} });
    default:
      return new ChatMessage({ ...(data as object), role: (meta["role"] as string | undefined) ?? e.role } as never);
  }
}

/** The session summary as the model is given it (as in Python): a
 * HumanMessage marked `lc_source: "summarization"`. */
export function summaryMessage(e: Message, prefix = DEFAULT_SUMMARY_PREFIX): HumanMessage {
  return new HumanMessage({
    content: `${prefix}${e.content}`,
    id: `redis-mem-summary-${e.id}`,
    additional_kwargs: { lc_source: SUMMARY_SOURCE, redis_mem: { summary_upto: e.id, tokens: e.tokens } },
  });
}

export interface RedisMemChatMessageHistoryOptions extends SessionSettings {
  /** Whether getMessages() starts with the session summary (default true). */
  includeSummary?: boolean;
  summaryPrefix?: string;
}

/** Chat history in one redis-mem session key. Every add is one
 * MEM.APPENDBATCH, each message's id as its MSGID (a retried add stores
 * nothing twice). */
export class RedisMemChatMessageHistory extends BaseListChatMessageHistory {
  lc_namespace = ["redis_mem", "langchain"];
  readonly mem: RedisMem;
  readonly key: string;
  readonly settings: SessionSettings;
  readonly includeSummary: boolean;
  readonly summaryPrefix: string;
  /** Replies of the last addMessages call (`summarize`: the session met its threshold). */
  lastResults: AppendResult[] = [];

  constructor(client: AnyClient | RedisMem, key: string, o: RedisMemChatMessageHistoryOptions = {}) {
    super();
    this.mem = client instanceof RedisMem ? client : new RedisMem(client);
    this.key = key;
    const { includeSummary, summaryPrefix, ...settings } = o;
    this.settings = settings;
    this.includeSummary = includeSummary ?? true;
    this.summaryPrefix = summaryPrefix ?? DEFAULT_SUMMARY_PREFIX;
  }

  private convert(entries: Message[], withSummary: boolean): BaseMessage[] {
    const out: BaseMessage[] = [];
    for (const e of entries) {
      if (e.isSummary) { if (withSummary) out.push(summaryMessage(e, this.summaryPrefix)); continue; }
      out.push(messageFromMem(e));
    }
    return out;
  }

  async getMessages(): Promise<BaseMessage[]> {
    return this.convert(await this.mem.get(this.key), this.includeSummary);
  }

  /** The summary and the newest messages that fit `tokens` (MEM.GET BUDGET). */
  async contextForBudget(tokens: number): Promise<BaseMessage[]> {
    return this.convert(await this.mem.get(this.key, { budget: tokens }), true);
  }

  async addMessage(message: BaseMessage): Promise<void> {
    await this.addMessages([message]);
  }

  async addMessages(messages: BaseMessage[]): Promise<void> {
    if (!messages.length) return;
    const batch = messages.map((msg) => {
      const { role, content, meta } = messageToMem(msg);
      const id = msgIdOf(msg);
      return { role, content, meta, ...(id ? { msgId: id } : {}) };
    });
    this.lastResults = await this.mem.appendBatch(this.key, batch, this.settings);
  }

  async clear(): Promise<void> {
    await this.mem.delete(this.key);
  }
}
