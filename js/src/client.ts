import { createHash, randomUUID } from "node:crypto";
import { type AnyClient, type Arg, type Transport, transportOf } from "./adapter.js";
import {
  type AppendResult, type JsonObject, type Message, type ModelEntry, type ModelInfo, type SessionInfo,
  type SummarizeBegin, type SummarizeCheck, appendResult, int, messages, modelEntries, modelInfo,
  sessionInfo, summarizeBegin, summarizeCheck, text, toMap,
} from "./replies.js";

/** The module's longest MSGID, in bytes. */
export const MAX_MSGID_BYTES = 128;
/** The MSGID of a message stored under `id` with another text: the id and
 * `suffix` (its text's hash), hashed whole when that is over the MSGID limit. */
export function ownMsgId(id: string, suffix: string): string {
  const own = `${id}~${suffix}`;
  return Buffer.byteLength(own) > MAX_MSGID_BYTES ? `sha256:${createHash("sha256").update(own).digest("hex")}` : own;
}

/** What the module refuses in a name (role, MSGID, model): control characters (C0, DEL, C1) and U+2028 / U+2029. */
export const NAME_BREAKER = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/;

/** A fresh MSGID (32 hex digits), as the Python client makes. */
export function newMsgId(): string {
  return randomUUID().replace(/-/g, "");
}

/** META: a JSON object (sent as JSON) or a JSON object's text. */
export type Meta = JsonObject | string;

/** Session settings any write may change (kept for later commands). */
export interface SessionSettings {
  /** The session's model (counts tokens with its tokenizer). */
  model?: string;
  /** Session TTL in seconds (0: no expiry); the key's TTL slides to it. */
  ttl?: number;
  maxTokens?: number;
  maxMsgs?: number;
  /** Keep only messages younger than this many seconds (0: no limit). */
  maxAge?: number;
}

export interface AppendOptions extends SessionSettings {
  /** Unix ms (default: the server's clock). */
  ts?: number;
  meta?: Meta;
  /** The message's own id (1-128 bytes), so a retry is stored once. One is
   * made up when omitted (unless the client's `autoMsgId` is false). */
  msgId?: string;
  /** The provider's token count, stored instead of the module's count. */
  tokens?: number;
}

export interface BatchMessage {
  role: string;
  content: string;
  ts?: number;
  meta?: Meta;
  msgId?: string;
  tokens?: number;
}

export interface GetOptions {
  /** The newest n messages. */
  last?: number;
  /** Messages with a greater id (no summary). */
  after?: number;
  /** The summary plus the longest run of newest messages that fits. */
  budget?: number;
}

export interface CheckOptions {
  /** The model whose context window sets the threshold (not with `context`). */
  model?: string;
  /** The context window in tokens (not with `model`). */
  context?: number;
  /** Messages a summary leaves out (the newest). */
  keep?: number;
}

export interface ImportOptions extends SessionSettings {
  /** Replace an existing session (else BUSYKEY when the key exists). */
  replace?: boolean;
}

export interface RedisMemOptions {
  /** Give every append a generated MSGID when none is given (default true). */
  autoMsgId?: boolean;
}

function opt(name: string, value: Arg | undefined | null): Arg[] {
  return value === undefined || value === null ? [] : [name, value];
}

function metaArg(meta: Meta | undefined): string | undefined {
  if (meta === undefined) return undefined;
  return typeof meta === "string" ? meta : JSON.stringify(meta, wellFormed);
}

function settings(s: SessionSettings): Arg[] {
  return [
    ...opt("MODEL", s.model), ...opt("TTL", s.ttl), ...opt("MAXTOKENS", s.maxTokens),
    ...opt("MAXMSGS", s.maxMsgs), ...opt("MAXAGE", s.maxAge),
  ];
}

function isOk(r: unknown): boolean {
  return r === true || text(r) === "OK";
}

function checkArgs(name: string, key: string, extra: Arg[], o: CheckOptions): Arg[] {
  return [name, key, ...extra, ...opt("MODEL", o.model), ...opt("CONTEXT", o.context), ...opt("KEEP", o.keep)];
}

/**
 * A typed client for the redis-mem module's MEM.* commands, over a node-redis
 * client (`redis` / `@redis/client`, RESP2 or RESP3) or an ioredis client.
 * Module errors are thrown as {@link RedisMemError} with the Redis error code.
 */
/** JSON.stringify replacer: a lone surrogate becomes U+FFFD, as it does in a
 * plain argument (node-redis and ioredis write strings as UTF-8), instead of
 * a `\ud800` escape the module refuses as not UTF-8. */
function wellFormed(_key: string, value: unknown): unknown {
  return typeof value === "string" ? (value as string & { toWellFormed(): string }).toWellFormed() : value;
}

export class RedisMem {
  readonly transport: Transport;
  readonly autoMsgId: boolean;

  constructor(client: AnyClient, options: RedisMemOptions = {}) {
    this.transport = transportOf(client);
    this.autoMsgId = options.autoMsgId ?? true;
  }

  /** Sends a raw command (its reply unparsed). */
  send(args: Arg[]): Promise<unknown> {
    return this.transport.send(args);
  }

  private msgId(given: string | undefined): string | undefined {
    return given ?? (this.autoMsgId ? newMsgId() : undefined);
  }

  /** MEM.APPEND: one message. */
  async append(key: string, role: string, content: string, o: AppendOptions = {}): Promise<AppendResult> {
    const msgId = this.msgId(o.msgId);
    const args: Arg[] = [
      "MEM.APPEND", key, role, content, ...opt("TS", o.ts), ...opt("META", metaArg(o.meta)), ...settings(o),
      ...opt("MSGID", msgId), ...opt("TOKENS", o.tokens),
    ];
    return appendResult(await this.send(args), msgId);
  }

  /** MEM.APPENDBATCH: several messages in one atomic command; one result per
   * message (one whose msgId the session already has: `duplicate`). */
  async appendBatch(key: string, batch: BatchMessage[], s: SessionSettings = {}): Promise<AppendResult[]> {
    const items = batch.map((m) => {
      const item: JsonObject = { role: m.role, content: m.content };
      if (m.ts !== undefined) item["ts"] = m.ts;
      if (m.tokens !== undefined) item["tokens"] = m.tokens;
      const id = this.msgId(m.msgId);
      if (id !== undefined) item["msgid"] = id;
      return item;
    });
    // A META given as text goes in as written, as append's does: parsed and
    // written again, its integers past 2^53 and its digits changed.
    const texts = batch.map((m, i) => {
      const body = JSON.stringify(items[i], wellFormed);
      if (m.meta === undefined) return body;
      if (typeof m.meta === "string") JSON.parse(m.meta); // a SyntaxError here, not a refused batch
      return `${body.slice(0, -1)},"meta":${metaArg(m.meta)!}}`;
    });
    const reply = await this.send(["MEM.APPENDBATCH", key, `[${texts.join(",")}]`, ...settings(s)]);
    if (!Array.isArray(reply)) throw new TypeError("MEM.APPENDBATCH: expected an array");
    return reply.map((r, i) => appendResult(r, items[i]!["msgid"] as string | undefined));
  }

  private getArgs(key: string, o: GetOptions): Arg[] {
    return ["MEM.GET", key, ...opt("LAST", o.last), ...opt("AFTER", o.after), ...opt("BUDGET", o.budget)];
  }

  /** MEM.GET: the summary (if any, first) then messages, oldest first; [] for
   * a missing key. */
  async get(key: string, o: GetOptions = {}): Promise<Message[]> {
    return messages(await this.send(this.getArgs(key, o)));
  }

  /** MEM.GET ... FORMAT JSON, parsed: `{conversation_history, summary,
   * total_tokens, model, redis_mem, <attributes>}`. JavaScript numbers: an
   * integer past 2^53 in a META or an attribute reads rounded; {@link
   * getJsonText} gives the document exactly. */
  async getJson(key: string, o: GetOptions = {}): Promise<JsonObject> {
    return JSON.parse(await this.getJsonText(key, o)) as JsonObject;
  }

  /** The MSGIDs of the session's messages, oldest first, and of the last
   * that left it (MAXAGE, the caps, a summary: the module keeps 128, in the
   * order they left): what a client that saves a whole chat each turn needs
   * to send only what follows the newest message the session holds or held.
   * `texts`: each held message's content by its MSGID (not those stored
   * truncated, reduced or with lone surrogates replaced), to tell an edited message (same id, another text) from a
   * stored one. Empty for a missing key. */
  async msgIds(key: string): Promise<{ held: string[]; departed: string[]; texts: Map<string, string> }> {
    const doc = await this.getJson(key);
    const entries = (list: unknown): { msgid?: unknown; content?: unknown }[] => (Array.isArray(list) ? list : [])
      .filter((e: unknown): e is { msgid?: unknown; content?: unknown } => e !== null && typeof e === "object");
    const ids = (list: unknown): string[] => entries(list).map((e) => e.msgid)
      .filter((id): id is string => typeof id === "string" && id !== "");
    const state = doc["redis_mem"];
    const departed = state !== null && typeof state === "object" ? (state as JsonObject)["departed_msgids"] : undefined;
    const texts = new Map<string, string>();
    for (const e of entries(doc["conversation_history"])) {
      // A message stored truncated, reduced or with its lone surrogates
      // replaced has lost the text to compare with (hostile pass 60 F1).
      const meta = (e as { meta?: unknown }).meta;
      const cut = meta !== null && typeof meta === "object"
        && ["redis_mem_truncated", "redis_mem_meta_dropped", "redis_mem_replaced_surrogates"].some((k) => k in meta);
      if (typeof e.msgid === "string" && typeof e.content === "string" && !cut) texts.set(e.msgid, e.content);
    }
    return { held: ids(doc["conversation_history"]), departed: ids(departed), texts };
  }

  /** MEM.GET ... FORMAT JSON as the server wrote it: what {@link import}
   * takes back whole, every number as written. */
  async getJsonText(key: string, o: GetOptions = {}): Promise<string> {
    return String(text(await this.send([...this.getArgs(key, o), "FORMAT", "JSON"])));
  }

  /** MEM.SUMMARIZE_CHECK: whether the session is due a summary, and up to where. */
  async check(key: string, o: CheckOptions = {}): Promise<SummarizeCheck> {
    return summarizeCheck(await this.send(checkArgs("MEM.SUMMARIZE_CHECK", key, [], o)));
  }

  /** MEM.SUMMARIZE_BEGIN: the check, and a lease of `leaseMs` when the session
   * is due and no other worker holds it (`lease` > 0). */
  async summarizeBegin(key: string, leaseMs: number, o: CheckOptions = {}): Promise<SummarizeBegin> {
    return summarizeBegin(await this.send(checkArgs("MEM.SUMMARIZE_BEGIN", key, [leaseMs], o)));
  }

  /** MEM.SUMMARIZE: replace the summary and every message with id <= upto by
   * `summary`. `lease`: the token MEM.SUMMARIZE_BEGIN granted. */
  async summarize(key: string, upto: number, summary: string, o: { lease?: number } = {}): Promise<AppendResult> {
    return appendResult(await this.send(["MEM.SUMMARIZE", key, upto, summary, ...opt("LEASE", o.lease || undefined)]));
  }

  /** MEM.EXTSET: an orchestrator's conversation id for `system`; true on OK. */
  async extSet(key: string, system: string, conversationId: string, o: { ex?: number } = {}): Promise<boolean> {
    return isOk(await this.send(["MEM.EXTSET", key, system, conversationId, ...opt("EX", o.ex)]));
  }

  /** MEM.EXTGET: the stored id, or null when unknown or expired. */
  async extGet(key: string, system: string): Promise<string | null> {
    const r = text(await this.send(["MEM.EXTGET", key, system]));
    return r === null || r === undefined ? null : String(r);
  }

  /** MEM.ATTRSET: `value` (sent as JSON; with `raw` a JSON text as is) as the
   * session's `name` member. `ex`: the attribute's own lifetime in seconds. */
  async attrSet(key: string, name: string, value: unknown, o: { ex?: number; raw?: boolean } = {}): Promise<boolean> {
    const json = o.raw ? String(value) : JSON.stringify(value);
    return isOk(await this.send(["MEM.ATTRSET", key, name, json, ...opt("EX", o.ex)]));
  }

  /** MEM.ATTRGET key name: the value parsed (its JSON text with `raw`), null
   * when absent. MEM.ATTRGET key: every member, as an object. */
  async attrGet(key: string, name: string, o?: { raw?: boolean }): Promise<unknown>;
  async attrGet(key: string, name?: undefined, o?: { raw?: boolean }): Promise<Record<string, unknown>>;
  async attrGet(key: string, name?: string, o: { raw?: boolean } = {}): Promise<unknown> {
    const decode = (v: unknown): unknown => (o.raw ? String(text(v)) : JSON.parse(String(text(v))));
    if (name !== undefined) {
      const r = await this.send(["MEM.ATTRGET", key, name]);
      return r === null || r === undefined ? null : decode(r);
    }
    const all = toMap(await this.send(["MEM.ATTRGET", key]));
    return Object.fromEntries(Object.entries(all).map(([k, v]) => [k, decode(v)]));
  }

  /** MEM.ATTRDEL: true when the member was set. */
  async attrDel(key: string, name: string): Promise<boolean> {
    return int(await this.send(["MEM.ATTRDEL", key, name])) === 1;
  }

  /** MEM.INFO, or null for a missing key. */
  async info(key: string): Promise<SessionInfo | null> {
    return sessionInfo(await this.send(["MEM.INFO", key]));
  }

  /** MEM.COUNT: the tokens `text` is as a message of `model` (with its role's
   * framing and META's tool calls). */
  async count(model: string, content: string, o: { role?: string; meta?: Meta } = {}): Promise<number> {
    return int(await this.send(["MEM.COUNT", model, content, ...opt("ROLE", o.role), ...opt("META", metaArg(o.meta))]));
  }

  /** MEM.MODELS model: what `model` resolves to. MEM.MODELS: the whole table. */
  async models(model: string): Promise<ModelInfo>;
  async models(): Promise<ModelEntry[]>;
  async models(model?: string): Promise<ModelInfo | ModelEntry[]> {
    if (model === undefined) return modelEntries(await this.send(["MEM.MODELS"]));
    return modelInfo(await this.send(["MEM.MODELS", model]));
  }

  /** MEM.IMPORT from an object or a JSON text (`{"conversation_history": [...], ...}`,
   * e.g. what {@link getJsonText} gives, exactly). BUSYKEY when the key exists, unless `replace`. */
  async import(key: string, doc: JsonObject | string, o: ImportOptions = {}): Promise<AppendResult> {
    const json = typeof doc === "string" ? doc : JSON.stringify(doc);
    const args: Arg[] = ["MEM.IMPORT", key, json, ...(o.replace ? ["REPLACE"] : []), ...settings(o)];
    return appendResult(await this.send(args));
  }

  /** DEL: removes the session; true when it existed. */
  async delete(key: string): Promise<boolean> {
    return int(await this.send(["DEL", key])) === 1;
  }
}
