// LangChain.js: a redis-mem session as the memory of a `createAgent` agent
// (langchain 1.x), mirroring the Python package's RedisMemMiddleware
// (redis_mem/middleware.py). Entry point `redis-mem/middleware`; needs
// langchain and @langchain/core.
import { createHash } from "node:crypto";
import { createMiddleware } from "langchain";
import { AIMessage, type BaseMessage, HumanMessage, SystemMessage, ToolMessage } from "@langchain/core/messages";
import type { AnyClient } from "./adapter.js";
import { RedisMem, type SessionSettings, ownMsgId } from "./client.js";
import { RedisMemError, RedisMemReplyError } from "./errors.js";
import { messageFromMem, messageToMem, msgIdOf, summaryMessage, DEFAULT_SUMMARY_PREFIX } from "./langchain.js";
import type { AppendResult, Message } from "./replies.js";
import { DEFAULT_MAX_MESSAGE_BYTES, TRUNCATED_MARKER, configValue, truncate } from "./limits.js";

/** The summary instructions (redis_mem.summarizing.SUMMARY_PROMPT). */
export const SUMMARY_PROMPT = "You maintain the running summary of a chat session. Merge the previous "
  + "summary (if any) with the new messages into one concise summary that keeps "
  + "facts, decisions, names, open questions and tool results needed to continue "
  + "the conversation. Reply with the summary only.";

/** summarize: summaries at the threshold (default); window: the caps evict
 * the oldest messages; none: the middleware does nothing. */
export type MemoryType = "summarize" | "window" | "none";
/** local: process-local memory with a warning while Redis is down; fail: throw. */
export type OnUnavailable = "local" | "fail";

/** Anything with LangChain's `invoke(messages)` (a chat model). */
export interface SummaryModel {
  invoke(messages: BaseMessage[]): Promise<{ content: unknown; text?: string }>;
}

export interface RedisMemMiddlewareOptions extends SessionSettings {
  /** The session key of a thread id (default `mem:{<thread_id>}`). */
  key?: (threadId: string) => string;
  /** A fixed session key (no thread id needed). */
  sessionId?: string;
  /** MEM.GET BUDGET: the context's tokens (default 8000). */
  budget?: number;
  memory?: MemoryType;
  /** The model that writes summaries (default: the agent's own). */
  summaryModel?: SummaryModel;
  summaryPrompt?: string;
  summaryPrefix?: string;
  /** The summary lease in ms (default 15000). */
  leaseMs?: number;
  /** Messages a summary leaves out (MEM.SUMMARIZE_BEGIN KEEP; default the module's). */
  keep?: number;
  onUnavailable?: OnUnavailable;
  /** Messages the local fallback keeps a session (default 50). */
  localWindow?: number;
  /** A Redis call slower than this (ms) counts as Redis down (default 3000). */
  timeoutMs?: number;
  /** Where warnings go (default console.warn). */
  warn?: (message: string) => void;
}

/** Redis could not be reached and `onUnavailable: "fail"`. */
export class RedisMemUnavailable extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "RedisMemUnavailable";
  }
}

/** A Redis call that failed for want of Redis (no reply, a closed
 * connection, a server still loading or a cluster down). */
class Unreachable extends Error {}

/** Reply errors that mean the server cannot serve now. */
const DOWN_CODES = new Set(["LOADING", "MASTERDOWN", "CLUSTERDOWN"]);

function unreachable(e: unknown): Unreachable | undefined {
  if (e instanceof Unreachable) return e;
  if (e instanceof RedisMemReplyError) return undefined;
  if (e instanceof RedisMemError) return DOWN_CODES.has(e.code) ? new Unreachable(e.message, { cause: e }) : undefined;
  return new Unreachable(String((e as Error | null)?.message ?? e), { cause: e });
}

/** Messages one MEM.APPENDBATCH takes at most (the module's cap). */
export const MAX_BATCH = 1000;
export { DEFAULT_MAX_MESSAGE_BYTES, TRUNCATED_MARKER, truncate };

/** Appended to a message cut to the token cap ({cap} tokens). */
export const TOKEN_TRUNCATED_MARKER = "\n[redis-mem: truncated to {kept} of {size} bytes (over {cap} tokens a message)]";
/** mem.max-tokens when CONFIG GET is refused (the module's default). */
const DEFAULT_MAX_TOKENS = 80_000;
/** A message holds at most this share of the session's token cap (Python's rule). */
const MESSAGE_TOKEN_SHARE = 4;

type BatchItem = ReturnType<typeof messageToMem> & { msgId: string };

/** Batches of at most MAX_BATCH items and about 3 x `limit` bytes (the
 * module takes 4 x), cut before a message that is not a tool result when it
 * can be (a call stays with its results). */
function batches(items: BatchItem[], limit: number): BatchItem[][] {
  const size = (x: BatchItem): number => Buffer.byteLength(x.content) + Buffer.byteLength(JSON.stringify(x.meta)) + 64;
  const out: BatchItem[][] = [];
  for (let start = 0; start < items.length;) {
    let end = start;
    for (let used = 0; end < items.length && end - start < MAX_BATCH && (end === start || used + size(items[end]!) <= 3 * limit); end++) {
      used += size(items[end]!);
    }
    if (end < items.length) {
      let cut = end;
      while (cut > start + 1 && items[cut]!.role === "tool") cut--;
      if (items[cut]!.role !== "tool") end = cut;
    }
    out.push(items.slice(start, end));
    start = end;
  }
  return out;
}

/** Sessions the per-process maps keep at most (the oldest go first). */
const MAX_SESSIONS = 1000;
/** MSGIDs remembered a session at most (a resend is harmless: MSGIDs). */
const MAX_STORED_IDS = 10000;

function touch<K, V>(map: Map<K, V>, key: K, make: () => V): V {
  const v = map.get(key) ?? make();
  map.delete(key);
  map.set(key, v);
  if (map.size > MAX_SESSIONS) map.delete(map.keys().next().value as K);
  return v;
}

/** A text as stored, with a lone surrogate, U+FFFD and "?" taken as one. */
function comparable(text: string): string {
  return Buffer.from(text).toString().replace(/[\ufffd?]/g, "?");
}

/** What a message says, for telling two messages under one id apart. */
function fingerprint(m: BaseMessage): string {
  // As stored: a lone surrogate is U+FFFD there, and a checkpointer may give
  // it back as "?" (hostile pass 60 F2); the three are one.
  const text = comparable(m.text);
  return createHash("sha256").update(`${m.getType()}\0${text}`).digest("hex").slice(0, 32);
}

function hasToolCalls(m: BaseMessage): boolean {
  return m instanceof AIMessage && (m.tool_calls?.length ?? 0) > 0;
}

/** The messages whose tool groups are complete (an AI message with tool
 * calls waits for all its results). */
function complete(messages: BaseMessage[]): BaseMessage[] {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    if (!hasToolCalls(m)) continue;
    const want = new Set((m as AIMessage).tool_calls!.map((c) => c.id));
    let j = i + 1;
    for (; j < messages.length && messages[j] instanceof ToolMessage; j++) want.delete((messages[j] as ToolMessage).tool_call_id);
    if (want.size) return messages.slice(0, i);
    i = j - 1;
  }
  return messages;
}

function transcript(entries: Message[], upto: number): string {
  let previous: string | undefined;
  const lines: string[] = [];
  for (const e of entries) {
    if (e.isSummary) { previous = e.content; continue; }
    if (e.id > upto) continue;
    const calls = (e.meta?.["tool_calls"] as { name?: string; args?: unknown }[] | undefined) ?? [];
    if (calls.length) {
      lines.push(`${e.role}: ${e.content}`.trimEnd() + " [called " + calls.map((c) => `${c.name ?? "?"}(${JSON.stringify(c.args ?? {})})`).join("; ") + "]");
    } else if (e.role === "tool") {
      lines.push(`tool ${String(e.meta?.["name"] ?? e.meta?.["tool_call_id"] ?? "tool")} returned: ${e.content}`);
    } else {
      lines.push(`${e.role}: ${e.content}`);
    }
  }
  return (previous ? `Previous summary:\n${previous}\n\n` : "") + `New messages:\n${lines.join("\n")}`;
}

function textOf(r: { content: unknown; text?: string }): string {
  if (typeof r.text === "string") return r.text;
  return typeof r.content === "string" ? r.content : JSON.stringify(r.content);
}

/**
 * The memory of a LangChain.js agent in redis-mem sessions:
 *
 * ```ts
 * const memory = new RedisMemMiddleware(redisClient, { budget: 8000 });
 * const agent = createAgent({ model, tools, middleware: [memory.middleware] });
 * await agent.invoke({ messages: [new HumanMessage({ content: "hi", id: "m1" })] },
 *   { configurable: { thread_id: "alice" } });
 * ```
 */
export class RedisMemMiddleware {
  readonly mem: RedisMem;
  readonly options: RedisMemMiddlewareOptions;
  readonly settings: SessionSettings;
  /** The `createAgent` middleware. */
  readonly middleware;
  /** MSGIDs this process stored, per session (saves resending them; the
   * module's MSGIDs make a resend harmless). */
  private readonly stored = new Map<string, Set<string>>();
  /** What each user message this process stored said, by its MSGID, per
   * session: a new question under a reused id is told from a retry. */
  private readonly sentText = new Map<string, Map<string, string>>();
  /** The local window of each session (the fallback while Redis is down). */
  private readonly local = new Map<string, { m: BaseMessage; id: string }[]>();
  /** Sessions whose local messages Redis may lack (written back once it answers). */
  private readonly behind = new Set<string>();
  private down = false;
  /** mem.max-message-bytes, read once. */
  private maxMessageBytes: number | undefined;
  /** A quarter of the session's token cap, read once. */
  private maxMessageTokens: number | undefined;
  /** The model MEM.COUNT counts with (the session's, else mem.default-model). */
  private countModel: string | undefined;
  private agentModel: SummaryModel | undefined;
  /** The replies of the last MEM.APPENDBATCH. */
  lastResults: AppendResult[] = [];
  /** What the model was given last (the context). */
  lastContext: BaseMessage[] = [];

  constructor(client: AnyClient | RedisMem, options: RedisMemMiddlewareOptions = {}) {
    this.mem = client instanceof RedisMem ? client : new RedisMem(client);
    this.options = options;
    const { model, ttl, maxTokens, maxMsgs, maxAge } = options;
    this.settings = Object.fromEntries(Object.entries({ model, ttl, maxTokens, maxMsgs, maxAge })
      .filter(([, v]) => v !== undefined)) as SessionSettings;
    const off = (options.memory ?? "summarize") === "none";
    this.middleware = createMiddleware({
      name: "RedisMemMiddleware",
      wrapModelCall: async (request, handler) => {
        if (off) return handler(request);
        const own = request.model as unknown as Partial<SummaryModel>;
        if (typeof own.invoke === "function") this.agentModel = own as SummaryModel;
        const key = this.keyOf(request.runtime.configurable);
        const context = await this.step(key, request.messages, true, request.runtime.configurable?.thread_id);
        this.lastContext = context;
        return handler({ ...request, messages: context });
      },
      afterModel: async (state, runtime) => {
        if (off) return undefined;
        await this.step(this.keyOf(runtime.configurable), state.messages, false, runtime.configurable?.thread_id);
        return undefined;
      },
    });
  }

  /** The session key of a run's configurable (`thread_id`). */
  keyOf(configurable: { thread_id?: string } | undefined): string {
    if (this.options.sessionId) return this.options.sessionId;
    const thread = configurable?.thread_id;
    if (!thread) throw new Error("RedisMemMiddleware: no thread_id in the run's configurable (or give sessionId)");
    return this.options.key ? this.options.key(String(thread)) : `mem:{${thread}}`;
  }

  private warn(msg: string): void {
    (this.options.warn ?? ((m: string) => console.warn(m)))(msg);
  }

  private call<T>(p: Promise<T>): Promise<T> {
    const ms = this.options.timeoutMs ?? 3000;
    let timer: NodeJS.Timeout | undefined;
    return Promise.race([p, new Promise<never>((_, fail) => { timer = setTimeout(() => fail(new Unreachable(`no reply in ${ms} ms`)), ms); })])
      .catch((e: unknown) => { throw unreachable(e) ?? e; })
      .finally(() => clearTimeout(timer));
  }

  /** A module setting (CONFIG GET; undefined when refused). */
  private async config(name: string): Promise<string | undefined> {
    try {
      return configValue(await this.call(this.mem.send(["CONFIG", "GET", name])), name);
    } catch (e) {
      if (e instanceof Unreachable) throw e;
      return undefined;
    }
  }

  private static positive(text: string | undefined, fallback: number): number {
    const n = Number(text);
    return Number.isSafeInteger(n) && n > 0 ? n : fallback;
  }

  /** mem.max-message-bytes (read once; the default when refused). */
  private async limit(): Promise<number> {
    this.maxMessageBytes ??= RedisMemMiddleware.positive(await this.config("mem.max-message-bytes"), DEFAULT_MAX_MESSAGE_BYTES);
    return this.maxMessageBytes;
  }

  /** Cuts every item over a quarter of the session's token cap: a message
   * larger than the cap would evict every older message of the conversation,
   * then be evicted itself. Tokens never exceed bytes, so only a longer text
   * is counted (MEM.COUNT with the session's model). */
  private async fitTokens(items: BatchItem[], messages: { m: BaseMessage; id: string }[], limit: number): Promise<void> {
    this.maxMessageTokens ??= Math.max(1, Math.floor((this.settings.maxTokens
      ?? RedisMemMiddleware.positive(await this.config("mem.max-tokens"), DEFAULT_MAX_TOKENS)) / MESSAGE_TOKEN_SHARE));
    const cap = this.maxMessageTokens;
    for (let i = 0; i < items.length; i++) {
      let size = Buffer.byteLength(items[i]!.content);
      if (size <= cap) continue;
      this.countModel ??= this.settings.model ?? (await this.config("mem.default-model")) ?? "gpt-4o";
      const count = async (text: string): Promise<number | undefined> => {
        try {
          return await this.call(this.mem.count(this.countModel!, text));
        } catch (e) {
          if (e instanceof Unreachable) throw e;
          return undefined; // an encoding the server leaves out: stored as it is
        }
      };
      let tokens = await count(items[i]!.content);
      if (tokens === undefined || tokens <= cap) continue;
      const full = Buffer.byteLength(messageToMem(messages[i]!.m).content);
      for (let attempt = 0; attempt < 6 && tokens !== undefined && tokens > cap; attempt++) {
        size = Math.max(0, Math.min(size - 1, Math.floor(size * cap / Math.max(1, tokens) * 0.9)));
        items[i] = this.item(messages[i]!.m, messages[i]!.id, limit, size, cap);
        tokens = await count(items[i]!.content);
      }
      this.warn(`redis-mem: a ${items[i]!.role} message of ${full} bytes is over ${cap} tokens (a quarter of the session's `
        + "maxTokens; it would evict the whole conversation): stored truncated (the model was given all of it)");
    }
  }

  /** What is stored of `m`: content over mem.max-message-bytes cut with a
   * marker (the model was given all of it), a META over it reduced to what
   * rebuilds the message, tool calls kept with their largest arguments
   * replaced by their size (a result needs its call). */
  private item(m: BaseMessage, id: string, limit: number, cut?: number, cap?: number): BatchItem {
    const x = messageToMem(m);
    const [content, size] = cut === undefined ? truncate(x.content, limit)
      : truncate(x.content, Math.min(limit, cut), TOKEN_TRUNCATED_MARKER.replace("{cap}", String(cap)));
    let meta = x.meta;
    if (size) {
      meta = { ...meta, redis_mem_truncated: size };
      delete meta["lc_content"]; // the blocks hold the same text
      if (cut === undefined) this.warn(`redis-mem: a ${x.role} message of ${size} bytes is over mem.max-message-bytes (${limit}): stored truncated (the model was given all of it)`);
    }
    if (Buffer.byteLength(JSON.stringify(meta)) > limit) {
      const calls = Array.isArray(meta["tool_calls"]) ? meta["tool_calls"] : [];
      const room = Math.floor(limit / (2 * Math.max(1, calls.length)));
      const kept = calls.map((call) => {
        const bytes = Buffer.byteLength(JSON.stringify(call));
        if (bytes <= room || call === null || typeof call !== "object" || Array.isArray(call)) return call;
        const c = call as Record<string, unknown>;
        const small: Record<string, unknown> = {};
        for (const k of ["id", "name", "type"]) if (c[k] !== undefined) small[k] = c[k];
        small["args"] = { redis_mem_truncated: bytes };
        return small;
      });
      const reduced: Record<string, unknown> = {};
      for (const k of ["lc_type", "id", "tool_call_id", "name", "status"]) if (meta[k] !== undefined) reduced[k] = meta[k];
      if (kept.length) reduced["tool_calls"] = kept;
      reduced["redis_mem_meta_dropped"] = true;
      meta = reduced as typeof meta;
      this.warn(`redis-mem: the META of a ${x.role} message is over mem.max-message-bytes (${limit}): stored reduced`);
    }
    return { role: x.role, content, meta, msgId: id };
  }

  /** Stores `messages` in order, in as many MEM.APPENDBATCHes as the
   * module's caps need (each one atomic; MSGIDs make a retry harmless). */
  private async store(key: string, messages: { m: BaseMessage; id: string }[]): Promise<AppendResult[]> {
    const limit = await this.limit();
    const results: AppendResult[] = [];
    const items = messages.map(({ m, id }) => this.item(m, id, limit));
    await this.fitTokens(items, messages, limit);
    for (const batch of batches(items, limit)) {
      results.push(...await this.call(this.mem.appendBatch(key, batch, this.settings)));
    }
    return results;
  }

  /** Gives `x`, a user message under an id stored with another text, an id
   * of its own (the old one and its text's hash); whether that id is new
   * (else it was stored under it before: a retry). Said once. `again`: the
   * text is not the latest sent under the id, so one stored under that id
   * before makes this a new one (A, B, then A). */
  private ownId(key: string, x: { m: BaseMessage; id: string }, known: { has(id: string): boolean }, again = false): boolean {
    const old = x.id;
    const print = fingerprint(x.m).slice(0, 16);
    x.id = ownMsgId(old, print);
    for (let n = 2; again && known.has(x.id); n++) x.id = ownMsgId(old, `${print}.${n}`);
    // On the state's message too, as the Python middleware does: the
    // run's later steps (and a checkpointer) see the id it is stored under.
    x.m.id = x.id;
    if (known.has(x.id)) return false;
    this.warn(`redis-mem: ${key}: the id ${old} is stored with another text; this user message is stored as ${x.id} `
      + "(give each message its own id)");
    return true;
  }

  private idOf(key: string, m: BaseMessage, i: number): string {
    return msgIdOf(m) ?? "lc:" + createHash("sha256").update(`${key}\0${i}\0${m.getType()}\0${m.text}`).digest("hex").slice(0, 32);
  }

  private remember(key: string, messages: { m: BaseMessage; id: string }[]): void {
    const win = touch(this.local, key, () => []);
    const ids = new Set(win.map((x) => x.id));
    for (const x of messages) if (!ids.has(x.id)) win.push(x);
    let cut = Math.max(0, win.length - (this.options.localWindow ?? 50));
    while (cut < win.length && win[cut]!.m instanceof ToolMessage) cut++; // never a result without its call
    this.local.set(key, win.slice(cut));
  }

  /** Stores the complete messages not stored yet (one MEM.APPENDBATCH), then
   * (when `withContext`) returns the context: MEM.GET BUDGET, or the local
   * window while Redis is down. */
  private async step(key: string, messages: BaseMessage[], withContext = true, thread?: string): Promise<BaseMessage[]> {
    // What this process stored is kept per agent state: with a fixed
    // sessionId several threads share one session, each with its own state,
    // and a thread first seen after another one's turn skipped its first
    // sight and stored its whole state again (hostile pass 59 F3).
    const state = this.options.sessionId && thread ? `${key}\0${thread}` : key;
    const done = touch(this.stored, state, () => new Set<string>());
    const sent = touch(this.sentText, state, () => new Map<string, string>());
    if (done.size > MAX_STORED_IDS) { done.clear(); sent.clear(); }
    const ready = complete(messages.filter((m) => !(m instanceof SystemMessage)))
      .map((m, i) => ({ m, id: this.idOf(key, m, i) }));
    for (const x of ready) {
      // An app's constant or restarted per-page id on a new question: taken
      // as stored, it was dropped and the model answered the previous one
      // (hostile pass 58 F2). It gets an id of its own, and it is said.
      const was = sent.get(x.id);
      if (was === undefined || !(x.m instanceof HumanMessage) || was === fingerprint(x.m)) continue;
      const old = x.id;
      this.ownId(key, x, done, true);
      // A retry is of the latest text sent under an id: A, B, then A again
      // is a new A (hostile pass 60 F3).
      sent.set(old, fingerprint(x.m));
    }
    let fresh = ready.filter((x) => !done.has(x.id));
    this.remember(key, fresh);
    try {
      if (!done.size && fresh.length > 1) {
        // This process's first sight of the session, with a longer state (a
        // checkpointer, a new process): the state up to the newest message
        // the session holds or let go last is taken as stored. MSGIDs alone
        // let every message older than the 128 departed ones in again, as
        // new (hostile pass 58 F1).
        const { held, departed, texts } = await this.call(this.mem.msgIds(key));
        const seen = new Set([...held, ...departed]);
        const edited = new Set<{ m: BaseMessage; id: string }>();
        for (const x of ready) {
          // A user message held under its id with another text was edited
          // (LangGraph's update_state keeps the id): stored under an id of
          // its own, as in a process that sent it (hostile pass 59 F1).
          const stored = texts.get(x.id);
          if (stored === undefined || !(x.m instanceof HumanMessage)) continue;
          if (comparable(stored) === comparable(messageToMem(x.m).content)) {
            sent.set(x.id, fingerprint(x.m));
            continue;
          }
          if (this.ownId(key, x, seen)) edited.add(x);
        }
        let last = ready.length;
        while (last > 0 && !seen.has(ready[last - 1]!.id)) last--;
        for (const x of ready.slice(0, last)) if (!edited.has(x)) done.add(x.id);
        fresh = fresh.filter((x) => !done.has(x.id));
      }
      if (this.behind.has(key)) {
        await this.writeBack(key, done);
        fresh = fresh.filter((x) => !done.has(x.id));
      }
      if (fresh.length) {
        this.lastResults = await this.store(key, fresh);
        for (const x of fresh) {
          done.add(x.id);
          if (x.m instanceof HumanMessage) sent.set(x.id, fingerprint(x.m));
        }
        if (this.lastResults.some((r) => r.summarize) && (this.options.memory ?? "summarize") === "summarize") {
          await this.summarize(key);
        }
      }
      if (this.down) { this.down = false; this.warn("redis-mem: Redis answers again; the sessions are back in Redis"); }
      if (!withContext) return [];
      const budget = this.options.budget ?? 8000;
      return this.merge(ready, await this.call(this.mem.get(key, { budget })), budget);
    } catch (e) {
      if (!(e instanceof Unreachable)) throw e;
      if ((this.options.onUnavailable ?? "local") === "fail") throw new RedisMemUnavailable(`redis-mem: Redis unreachable: ${String(e)}`, { cause: e });
      if (!this.down) {
        this.warn(`redis-mem: WARNING Redis is unreachable (${String(e)}): the agent's memory is process-local `
          + "until it answers again (continuity is lost on restart)");
      }
      this.down = true;
      this.behind.add(key);
      return withContext ? (this.local.get(key) ?? []).map((x) => x.m) : [];
    }
  }

  /** The context the model is given: the stored messages that fit the
   * budget, each as the state holds it when it does (a message stored
   * truncated is given whole), then the newest state messages the budget
   * left out (one huge message), as they are; never opening on an answer
   * cut loose from its question. */
  private merge(state: { m: BaseMessage; id: string }[], entries: Message[], budget: number): BaseMessage[] {
    const byId = new Map(state.map((x) => [x.id, x.m]));
    const ids = new Set<string>();
    const context = entries.map((e) => {
      if (e.isSummary) return summaryMessage(e, this.options.summaryPrefix ?? DEFAULT_SUMMARY_PREFIX);
      if (e.msgId) ids.add(e.msgId);
      return (e.msgId && byId.get(e.msgId)) || messageFromMem(e);
    });
    let from = state.length;
    while (from > 0 && !ids.has(state[from - 1]!.id)) from--;
    if (from < state.length) this.warn(`redis-mem: the newest messages do not fit budget ${budget}; sent as they are`);
    let out = [...context, ...state.slice(from).map((x) => x.m)];
    if (out[0] instanceof AIMessage || out[0] instanceof ToolMessage) {
      const first = out.findIndex((m) => m instanceof HumanMessage);
      if (first > 0) out = out.slice(first);
    }
    return out;
  }

  /** Writes back, in order, the messages of the local window that were not
   * stored (those of the outage; their MSGIDs: nothing twice). */
  private async writeBack(key: string, done: Set<string>): Promise<void> {
    const todo = complete((this.local.get(key) ?? []).map((x) => x.m)).length;
    const win = (this.local.get(key) ?? []).slice(0, todo).filter((x) => !done.has(x.id));
    if (win.length) {
      this.lastResults = await this.store(key, win);
      for (const x of win) done.add(x.id);
    }
    this.behind.delete(key);
  }

  /** A summary under a lease (MEM.SUMMARIZE_BEGIN / MEM.SUMMARIZE ... LEASE),
   * written by the summary model (default the agent's). A failure is logged;
   * a later step retries once the lease ends. */
  private async summarize(key: string): Promise<void> {
    const model = this.options.summaryModel ?? this.agentModel;
    if (!model) return;
    const begin = await this.call(this.mem.summarizeBegin(key, this.options.leaseMs ?? 15000,
      this.options.keep === undefined ? {} : { keep: this.options.keep }));
    if (!begin.summarize || begin.lease <= 0 || begin.upto <= 0) return;
    try {
      const entries = await this.call(this.mem.get(key));
      const reply = await model.invoke([
        new SystemMessage(this.options.summaryPrompt ?? SUMMARY_PROMPT),
        new HumanMessage(transcript(entries, begin.upto)),
      ]);
      await this.call(this.mem.summarize(key, begin.upto, textOf(reply), { lease: begin.lease }));
    } catch (e) {
      this.warn(`redis-mem: the summary of ${key} failed (${String(e)}); a later step retries once the lease ends`);
    }
  }
}
