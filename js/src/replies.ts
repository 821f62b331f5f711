import { RedisMemReplyError } from "./errors.js";

/** The role MEM.GET gives the summary entry (always the first entry). */
export const SUMMARY_ROLE = "summary";

export type JsonObject = { [k: string]: unknown };

// ---------------------------------------------------------------------------
// Reply normalisation: RESP3 maps (objects or Maps) and RESP2 flat arrays;
// Buffers (a client returning bytes) as UTF-8 strings.
// ---------------------------------------------------------------------------

/** A Buffer / Uint8Array as a UTF-8 string; anything else unchanged. */
export function text(v: unknown): unknown {
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  return v;
}

function textOrNull(v: unknown): string | null {
  const t = text(v);
  if (t === null || t === undefined) return null;
  if (typeof t !== "string") throw new RedisMemReplyError(`expected a string, got ${String(t)}`);
  return t;
}

function req(m: Record<string, unknown>, k: string): unknown {
  if (!(k in m)) throw new RedisMemReplyError(`reply without field ${k}`);
  return m[k];
}

/** An integer reply (number, or a numeric string / bigint some clients give). */
export function int(v: unknown): number {
  const t = text(v);
  if (typeof t === "number") return t;
  if (typeof t === "bigint") return Number(t);
  if (typeof t === "string" && /^-?\d+$/.test(t)) return Number(t);
  throw new RedisMemReplyError(`expected an integer, got ${String(t)}`);
}

function bool(v: unknown): boolean {
  return v === true || (v !== false && v !== null && v !== undefined && int(v) !== 0);
}

/** A module map reply as a plain object with string keys. */
export function toMap(reply: unknown): Record<string, unknown> {
  // No prototype: a field named `__proto__` (an attribute may be) is a field.
  const out = Object.create(null) as Record<string, unknown>;
  if (Array.isArray(reply)) {
    if (reply.length % 2) throw new RedisMemReplyError("not a field/value array");
    for (let i = 0; i < reply.length; i += 2) out[String(text(reply[i]))] = reply[i + 1];
  } else if (reply instanceof Map) {
    for (const [k, v] of reply) out[String(text(k))] = v;
  } else if (reply !== null && typeof reply === "object" && !(reply instanceof Uint8Array)) {
    for (const [k, v] of Object.entries(reply)) out[k] = v;
  } else {
    throw new RedisMemReplyError(`not a map reply: ${String(reply)}`);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Typed results
// ---------------------------------------------------------------------------

/** Reply of MEM.APPEND, MEM.APPENDBATCH (one per message), MEM.SUMMARIZE and
 * MEM.IMPORT. `duplicate`: the write was a retry of one already applied (same
 * MSGID, or the same summary); nothing changed and `id`/`tokens` are the
 * original message's. `msgId`: the MSGID this client sent (undefined for
 * other commands). */
export interface AppendResult {
  id: number;
  tokens: number;
  totalTokens: number;
  messages: number;
  trimmed: number;
  summarize: boolean;
  duplicate: boolean;
  msgId?: string;
}

export function appendResult(reply: unknown, msgId?: string): AppendResult {
  const m = toMap(reply);
  const r: AppendResult = {
    id: int(req(m, "id")),
    tokens: int(req(m, "tokens")),
    totalTokens: int(req(m, "total_tokens")),
    messages: int(req(m, "messages")),
    trimmed: int(m["trimmed"] ?? 0),
    summarize: bool(m["summarize"] ?? 0),
    duplicate: bool(m["duplicate"] ?? 0),
  };
  if (msgId !== undefined) r.msgId = msgId;
  return r;
}

/** One entry of MEM.GET. The summary, when there is one, is the first entry
 * (role `summary`, `id` the last message id it covers, `isSummary` true). */
export interface Message {
  id: number;
  role: string;
  content: string;
  /** Unix ms. */
  ts: number;
  tokens: number;
  meta?: JsonObject;
  /** The client's id of the message (MSGID), when it was given one. */
  msgId?: string;
  /** Whether this entry is the session summary (the reply's `summary`
   * marker; with an older module that sends none, a first entry with role
   * "summary"). */
  isSummary: boolean;
}

export function messages(reply: unknown): Message[] {
  if (reply === null || reply === undefined) return [];
  if (!Array.isArray(reply)) throw new RedisMemReplyError("MEM.GET: expected an array");
  const raw = reply.map((e) => toMap(e));
  const marked = raw.some((m) => m["summary"] !== undefined && m["summary"] !== null);
  return raw.map((m, i) => {
    const meta = textOrNull(m["meta"]);
    const msgId = textOrNull(m["msgid"]);
    const role = textOrNull(req(m, "role")) ?? "";
    const marker = m["summary"];
    const out: Message = {
      id: int(req(m, "id")),
      role,
      content: textOrNull(req(m, "content")) ?? "",
      ts: int(req(m, "ts")),
      tokens: int(req(m, "tokens")),
      isSummary: marker !== undefined && marker !== null ? bool(marker) : !marked && i === 0 && role === SUMMARY_ROLE,
    };
    if (meta !== null) out.meta = JSON.parse(meta) as JsonObject;
    if (msgId !== null) out.msgId = msgId;
    return out;
  });
}

/** Reply of MEM.SUMMARIZE_CHECK. */
export interface SummarizeCheck {
  summarize: boolean;
  totalTokens: number;
  messages: number;
  thresholdTokens: number;
  thresholdMessages: number;
  keep: number;
  /** The last message id a summary should cover (0: nothing to summarize). */
  upto: number;
  uptoTokens: number;
}

/** Reply of MEM.SUMMARIZE_BEGIN: the check, plus `lease` (the token to give
 * MEM.SUMMARIZE; 0 when not granted) and `leaseExpires` (Unix ms of the live
 * lease's end, this one's or another worker's; 0 when none). */
export interface SummarizeBegin extends SummarizeCheck {
  lease: number;
  leaseExpires: number;
}

export function summarizeCheck(reply: unknown): SummarizeCheck {
  const m = toMap(reply);
  return {
    summarize: bool(m["summarize"] ?? 0),
    totalTokens: int(req(m, "total_tokens")),
    messages: int(req(m, "messages")),
    thresholdTokens: int(req(m, "threshold_tokens")),
    thresholdMessages: int(req(m, "threshold_messages")),
    keep: int(req(m, "keep")),
    upto: int(req(m, "upto")),
    uptoTokens: int(req(m, "upto_tokens")),
  };
}

export function summarizeBegin(reply: unknown): SummarizeBegin {
  const m = toMap(reply);
  return { ...summarizeCheck(m), lease: int(m["lease"] ?? 0), leaseExpires: int(m["lease_expires"] ?? 0) };
}

/** Reply of MEM.INFO. The last five fields are undefined with an older
 * module that does not send them. */
export interface SessionInfo {
  messages: number;
  totalTokens: number;
  model: string;
  encoding: string;
  contextWindow: number;
  maxTokens: number;
  maxMsgs: number;
  /** Session TTL in seconds (0: none). */
  ttl: number;
  firstId: number;
  lastId: number;
  created: number;
  updated: number;
  summaryUpto: number;
  /** External systems with a conversation id (MEM.EXTSET). */
  external: string[];
  /** Messages the caps or MAXAGE removed with no summary covering them. */
  evicted?: number;
  /** Messages covered by summaries. */
  summarized?: number;
  /** Unix ms of the last summary; 0 when none. */
  summaryTs?: number;
  /** External system -> milliseconds its id has left (as PTTL). */
  externalTtl?: Record<string, number>;
  /** Milliseconds a summarizer's lease has left (0: none). */
  leaseTtl?: number;
}

export function sessionInfo(reply: unknown): SessionInfo | null {
  if (reply === null || reply === undefined) return null;
  const m = toMap(reply);
  const ext = m["external"];
  const out: SessionInfo = {
    messages: int(req(m, "messages")),
    totalTokens: int(req(m, "total_tokens")),
    model: textOrNull(m["model"]) ?? "",
    encoding: textOrNull(m["encoding"]) ?? "",
    contextWindow: int(req(m, "context_window")),
    maxTokens: int(req(m, "maxtokens")),
    maxMsgs: int(req(m, "maxmsgs")),
    ttl: int(req(m, "ttl")),
    firstId: int(req(m, "first_id")),
    lastId: int(req(m, "last_id")),
    created: int(req(m, "created")),
    updated: int(req(m, "updated")),
    summaryUpto: int(req(m, "summary_upto")),
    external: Array.isArray(ext) ? ext.map((x) => String(text(x))) : [],
  };
  const opt = [["evicted", "evicted"], ["summarized", "summarized"], ["summary_ts", "summaryTs"], ["lease_ttl", "leaseTtl"]] as const;
  for (const [k, f] of opt) if (m[k] !== undefined && m[k] !== null) out[f] = int(m[k]);
  const et = m["external_ttl"];
  if (et !== undefined && et !== null) {
    out.externalTtl = {};
    for (const [k, v] of Object.entries(toMap(et))) out.externalTtl[k] = int(v);
  }
  return out;
}

/** Reply of MEM.MODELS model: what the model table resolves the name to.
 * `exact`: counted with the vendor's own tokenizer. `contextWindow`: 0 when
 * unknown. `entry`: the table pattern that matched (null: none did). */
export interface ModelInfo {
  model: string;
  encoding: string;
  exact: boolean;
  contextWindow: number;
  entry: string | null;
  source: "builtin" | "config" | "none" | string;
}

export function modelInfo(reply: unknown): ModelInfo {
  const m = toMap(reply);
  return {
    model: textOrNull(req(m, "model")) ?? "",
    encoding: textOrNull(req(m, "encoding")) ?? "",
    exact: bool(m["exact"] ?? 0),
    contextWindow: int(m["context_window"] ?? 0),
    entry: textOrNull(m["entry"]),
    source: textOrNull(m["source"]) ?? "none",
  };
}

/** One entry of MEM.MODELS without a name: the model table in effect. */
export interface ModelEntry {
  /** An exact name, or a prefix ending in `*`. */
  name: string;
  /** `default`: the vendor publishes no tokenizer (mem.default-encoding counts). */
  encoding: string;
  contextWindow: number;
  source: "builtin" | "config" | string;
}

export function modelEntries(reply: unknown): ModelEntry[] {
  if (!Array.isArray(reply)) throw new RedisMemReplyError("MEM.MODELS: expected an array");
  return reply.map((e) => {
    const m = toMap(e);
    return {
      name: textOrNull(req(m, "name")) ?? "",
      encoding: textOrNull(req(m, "encoding")) ?? "",
      contextWindow: int(m["context_window"] ?? 0),
      source: textOrNull(m["source"]) ?? "builtin",
    };
  });
}
