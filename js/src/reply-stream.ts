// Resumable reply streams: one Redis Stream per reply, beside its session, in
// the layout docs/STREAMS.md defines and the Python package's ReplyStream
// writes and reads, so a reply written by one is read by the other.
import type { AnyClient, Arg } from "./adapter.js";
import { MAX_MSGID_BYTES, NAME_BREAKER, RedisMem, newMsgId, type SessionSettings } from "./client.js";
import { RedisMemError } from "./errors.js";
import { type JsonObject, text, toMap } from "./replies.js";
import { DEFAULT_MAX_MESSAGE_BYTES, configValue, truncate } from "./limits.js";

/** Seconds the stream lives after its last write. */
export const DEFAULT_TTL = 300;
/** Events a stream keeps (`XADD MAXLEN ~`): far more than a reply's chunks. */
export const DEFAULT_MAXLEN = 10_000;

export type ReplyEventType = "chunk" | "end" | "error";

/** One event of a reply. `id`: its stream id (SSE `id:`, `Last-Event-ID`).
 * `text`: a chunk's text, an error's message ("" for an end). An end carries
 * `msgId` (the reply id), `messageId` (the stored message's id in the
 * session, undefined when not stored) and `meta`. */
export interface ReplyEvent {
  id: string;
  type: ReplyEventType | string;
  text: string;
  msgId?: string;
  messageId?: number;
  meta?: JsonObject;
  /** A chunk's number (0 for the first); undefined from an older producer. */
  n?: number;
  /** An end's count of chunks written; undefined from an older producer. */
  chunks?: number;
}

/** The producer ended the reply with an error event. */
export class ReplyStreamError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ReplyStreamError";
  }
}

/** Events after the reader's `after` may have been trimmed (MAXLEN) before it
 * read them: the reply cannot be resumed from there without a hole. */
export class ReplyStreamGap extends ReplyStreamError {
  constructor(readonly replyId: string, readonly after: string, readonly firstKept: string, why?: string) {
    super(why ?? `reply ${replyId}: events before ${firstKept} were trimmed (MAXLEN); a reader after ${after} would miss some`);
    this.name = "ReplyStreamGap";
  }
}


/** No event came for `idleTimeout` seconds (the producer died, or the reply
 * id is unknown). */
export class ReplyStreamTimeout extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ReplyStreamTimeout";
  }
}

function hashTag(key: string): string | null {
  const start = key.indexOf("{");
  if (start < 0) return null;
  const end = key.indexOf("}", start + 1);
  if (end < 0 || end === start + 1) return null;
  return key.slice(start + 1, end);
}

/** The stream key of reply `replyId` of the session `sessionKey`, in the
 * session's hash slot: `<session key>:reply:<reply id>` when the session key
 * has a hash tag, else `{<session key>}:reply:<reply id>`. */
export function replyStreamKey(sessionKey: string, replyId: string): string {
  if (!sessionKey) throw new RangeError("the session key must be a non-empty string");
  if (!replyId) throw new RangeError("the reply id must not be empty");
  if (hashTag(sessionKey) !== null) return `${sessionKey}:reply:${replyId}`;
  if (sessionKey.includes("}")) {
    throw new RangeError(`session key ${JSON.stringify(sessionKey)} has no hash tag and holds '}': give it one, e.g. 'mem:{id}'`);
  }
  return `{${sessionKey}}:reply:${replyId}`;
}

const EVENT_ID = /^[0-9]{1,20}(-[0-9]{1,20})?$/;
const U64_MAX = (1n << 64n) - 1n;

/** `after` as an event id to read after ("0", "<ms>" or "<ms>-<seq>";
 * undefined, null or "" -> "0"); RangeError for anything else (a client's
 * `Last-Event-ID` is input: check it before answering). */
export function validEventId(after: string | null | undefined): string {
  const eid = after === undefined || after === null || after === "" ? "0" : after;
  if (typeof eid !== "string" || !EVENT_ID.test(eid) || eid.split("-").some((part) => BigInt(part) > U64_MAX)) {
    throw new RangeError(`not an event id: ${String(after)}`);
  }
  return eid;
}

function idKey(eid: string): [bigint, bigint] {
  const [ms, seq] = eid.split("-");
  return [BigInt(ms || 0), BigInt(seq || 0)];
}

function idAfter(a: string, b: string): boolean {
  const [am, as] = idKey(a);
  const [bm, bs] = idKey(b);
  return am > bm || (am === bm && as > bs);
}

const STREAM_ID = /^[0-9]+-[0-9]+$/;

function fields(v: unknown): Record<string, string> {
  const m = toMap(v);
  return Object.fromEntries(Object.entries(m).map(([k, x]) => [k, String(text(x))]));
}

/** The entries (id, fields) of an XREAD / XREVRANGE reply, whatever its shape
 * (RESP2 `[[key, entries]]`, RESP3 `{key: entries}`), in order. */
function entries(reply: unknown): Array<[string, Record<string, string>]> {
  const out: Array<[string, Record<string, string>]> = [];
  const walk = (x: unknown): void => {
    x = text(x);
    if (Array.isArray(x)) {
      const head = text(x[0]);
      if (x.length === 2 && typeof head === "string" && STREAM_ID.test(head) && (x[1] === null || typeof x[1] === "object")) {
        if (x[1] !== null) out.push([head, fields(x[1])]);
      } else {
        for (const item of x) walk(item);
      }
    } else if (x instanceof Map) {
      for (const v of x.values()) walk(v);
    } else if (x !== null && typeof x === "object") {
      for (const v of Object.values(x)) walk(v);
    }
  };
  walk(reply);
  return out;
}

function event(id: string, f: Record<string, string>): ReplyEvent {
  const e: ReplyEvent = { id, type: f["type"] ?? "", text: f["text"] ?? "" };
  if (f["msgid"] !== undefined) e.msgId = f["msgid"];
  if (f["message_id"]) e.messageId = Number(f["message_id"]);
  if (f["meta"]) {
    try {
      e.meta = JSON.parse(f["meta"]) as JsonObject;
    } catch {
      // another producer's malformed meta: the event without it
    }
  }
  if (f["n"] !== undefined && /^[0-9]+$/.test(f["n"])) e.n = Number(f["n"]);
  if (f["chunks"] !== undefined && /^[0-9]+$/.test(f["chunks"])) e.chunks = Number(f["chunks"]);
  return e;
}

export function isLast(e: ReplyEvent): boolean {
  return e.type === "end" || e.type === "error";
}

const KNOWN = new Set(["chunk", "end", "error"]);

export interface ReplyStreamOptions {
  /** The reply's id (default: a fresh 32-hex id): names the stream, and is
   * the stored message's MSGID. A reader elsewhere gives the same one. */
  replyId?: string;
  /** Seconds the stream lives after its last write (EXPIRE on each write). */
  ttl?: number;
  /** Events kept (XADD MAXLEN ~; `approximate: false` for `=`). */
  maxLen?: number;
  approximate?: boolean;
  /** Whether finish() stores the text as the session's assistant message. */
  store?: boolean;
  /** MEM.APPEND settings for that message. */
  appendOptions?: SessionSettings & { tokens?: number };
}

export interface ReadOptions {
  /** Wait this many ms for an event when there is none yet (0: forever). */
  block?: number;
  count?: number;
}

export interface EventsOptions {
  /** Each XREAD's BLOCK in ms (default 1000). */
  block?: number;
  /** Seconds without an event before ReplyStreamTimeout (default: ttl). */
  idleTimeout?: number;
}

/**
 * One reply of a session, as a Redis Stream (docs/STREAMS.md). A producer
 * writes chunks and finishes (storing the text once, MSGID = the reply id);
 * readers on any process read from the last event id they got.
 *
 * A reader that blocks (`events`, `read` with `block`) holds its connection
 * meanwhile: give readers their own client (node-redis: `client.duplicate()`).
 */
export class ReplyStream {
  readonly mem: RedisMem;
  readonly sessionKey: string;
  readonly replyId: string;
  readonly streamKey: string;
  readonly ttl: number;
  readonly maxLen: number;
  readonly approximate: boolean;
  readonly store: boolean;
  readonly appendOptions: SessionSettings & { tokens?: number };
  lastId: string | null = null;
  finished: ReplyEvent | null = null;
  private parts: string[] = [];

  constructor(client: AnyClient | RedisMem, sessionKey: string, o: ReplyStreamOptions = {}) {
    this.mem = client instanceof RedisMem ? client : new RedisMem(client);
    this.ttl = o.ttl ?? DEFAULT_TTL;
    this.maxLen = o.maxLen ?? DEFAULT_MAXLEN;
    if (!(this.ttl > 0)) throw new RangeError("ttl must be a positive number of seconds");
    if (!(this.maxLen > 0)) throw new RangeError("maxLen must be positive");
    this.approximate = o.approximate ?? true;
    this.store = o.store ?? true;
    this.appendOptions = { ...(o.appendOptions ?? {}) };
    this.sessionKey = sessionKey;
    this.replyId = o.replyId ?? newMsgId();
    const raw = Buffer.from(this.replyId, "utf8");
    if (typeof this.replyId !== "string" || raw.length === 0 || raw.length > MAX_MSGID_BYTES
      || NAME_BREAKER.test(this.replyId) || this.replyId !== (this.replyId as string & { toWellFormed(): string }).toWellFormed()) {
      throw new RangeError(`a reply id is 1 to ${MAX_MSGID_BYTES} bytes of text without control characters (it is the message's MSGID)`);
    }
    this.streamKey = replyStreamKey(sessionKey, this.replyId);
  }

  /** What this object wrote so far. */
  get text(): string {
    return this.parts.join("");
  }

  private checkOpen(): void {
    if (this.finished) throw new Error(`reply ${this.replyId} already ended (${this.finished.type})`);
  }

  private async xadd(f: Record<string, string>, id = "*"): Promise<string> {
    const args: Arg[] = ["XADD", this.streamKey, "MAXLEN", this.approximate ? "~" : "=", this.maxLen, id];
    for (const [k, v] of Object.entries(f)) args.push(k, v);
    // Sent back to back on one connection (a pipeline): XADD runs first.
    const [eid] = await Promise.all([this.mem.send(args), this.mem.send(["EXPIRE", this.streamKey, this.ttl])]);
    this.lastId = String(text(eid));
    return this.lastId;
  }

  /** Appends a chunk of the reply; returns its event id. */
  async write(chunk: string): Promise<string> {
    this.checkOpen();
    if (typeof chunk !== "string") throw new TypeError("a chunk is a string");
    const eid = await this.xadd({ type: "chunk", text: chunk, n: String(this.parts.length) });
    this.parts.push(chunk);
    return eid;
  }

  private async lastEvent(): Promise<ReplyEvent | null> {
    const got = entries(await this.mem.send(["XREVRANGE", this.streamKey, "+", "-", "COUNT", 1]));
    return got.length ? event(...got[got.length - 1]!) : null;
  }

  /** Ends the reply: stores its text (what was written, or `text`) as the
   * session's assistant message (one MEM.APPEND ... MSGID <reply id>, `meta`
   * its META), then appends the end event. Retried (this object or another
   * with the same reply id), the message is stored once and the end event
   * written once. */
  async finish(o: { meta?: JsonObject; text?: string } = {}): Promise<ReplyEvent> {
    if (this.finished?.type === "end") return this.finished;
    this.checkOpen();
    let full = o.text ?? this.text;
    let meta = o.meta && Object.keys(o.meta).length ? o.meta : undefined;
    let messageId: number | undefined;
    if (this.store) {
      const limit = await this.limit();
      const [cut, size] = truncate(full, limit);
      if (size) {
        // Refused on every retry otherwise: stored cut with the marker (the
        // chunks keep it whole until the stream's TTL).
        full = cut;
        meta = { ...(meta ?? {}), redis_mem_truncated: size };
        console.warn(`redis-mem: reply ${this.replyId} of ${size} bytes is over mem.max-message-bytes (${limit}): stored truncated`);
      }
      const r = await this.mem.append(this.sessionKey, "assistant", full, {
        ...this.appendOptions, msgId: this.replyId, ...(meta ? { meta } : {}),
      });
      messageId = r.id || undefined;
    }
    const f: Record<string, string> = { type: "end", msgid: this.replyId, chunks: String(this.parts.length) };
    if (messageId !== undefined) f["message_id"] = String(messageId);
    if (meta) f["meta"] = JSON.stringify(meta);
    // One end event, without MULTI: the explicit id right after the last
    // event's; a racing finish computes the same one and is refused, then
    // finds the first's end event.
    for (let attempt = 0; ; attempt++) {
      const last = await this.lastEvent();
      if (last && last.type === "end" && last.msgId === this.replyId) {
        this.finished = last;
        return last;
      }
      let id = "0-1";
      if (last) {
        const [ms, seq] = idKey(last.id);
        id = `${ms}-${seq + 1n}`;
      }
      try {
        this.finished = event(await this.xadd(f, attempt >= 3 ? "*" : id), f);
        return this.finished;
      } catch (e) {
        if (!(e instanceof RedisMemError) || !/equal or smaller/i.test(e.message) || attempt >= 3) throw e;
      }
    }
  }

  private maxMessageBytes: number | undefined;

  /** mem.max-message-bytes (CONFIG GET once; the default when refused). */
  private async limit(): Promise<number> {
    if (this.maxMessageBytes === undefined) {
      let n = NaN;
      try {
        n = Number(configValue(text(await this.mem.send(["CONFIG", "GET", "mem.max-message-bytes"])), "mem.max-message-bytes"));
      } catch (e) {
        if (!(e instanceof RedisMemError)) throw e;
      }
      this.maxMessageBytes = Number.isSafeInteger(n) && n > 0 ? n : DEFAULT_MAX_MESSAGE_BYTES;
    }
    return this.maxMessageBytes;
  }

  /** Ends the reply with an error event; nothing is stored. */
  async error(message: string): Promise<ReplyEvent> {
    this.checkOpen();
    const f = { type: "error", text: String(message) };
    this.finished = event(await this.xadd(f), f);
    return this.finished;
  }

  /** The events after event id `after` ("0": from the start), with XREAD;
   * [] when none came within `block` ms. */
  async read(after = "0", o: ReadOptions = {}): Promise<ReplyEvent[]> {
    if (o.block !== undefined && !(o.block >= 0)) throw new RangeError("block is a number of milliseconds >= 0");
    const args: Arg[] = ["XREAD", ...(o.count !== undefined ? ["COUNT", o.count] : []),
      ...(o.block !== undefined ? ["BLOCK", o.block] : []), "STREAMS", this.streamKey, validEventId(after)];
    return entries(await this.mem.send(args)).map(([id, f]) => event(id, f));
  }

  private async checkGap(after: string): Promise<void> {
    let reply: unknown;
    try {
      reply = await this.mem.send(["XINFO", "STREAM", this.streamKey]);
    } catch (e) {
      if (e instanceof RedisMemError && /no such key/i.test(e.message)) return; // expired meanwhile
      throw e;
    }
    if (!reply) return;
    const info = toMap(reply);
    const added = info["entries-added"];
    const length = info["length"];
    const first = entries([info["first-entry"]]);
    if (added === undefined || length === undefined || !first.length || Number(added) <= Number(length)) return;
    if (idAfter(first[0]![0], after)) throw new ReplyStreamGap(this.replyId, after, first[0]![0]);
  }

  /** Every event after `after` as it comes, the end (or error) event last (a
   * type this version does not know is skipped): what an SSE endpoint sends,
   * `after` being the client's `Last-Event-ID`. ReplyStreamGap when events
   * after `after` were trimmed; ReplyStreamTimeout after `idleTimeout`
   * seconds without an event. */
  async *events(after = "0", o: EventsOptions = {}): AsyncGenerator<ReplyEvent> {
    let from = validEventId(after);
    const idle = o.idleTimeout ?? this.ttl;
    const block = Math.max(1, Math.min(o.block ?? 1000, Math.floor(idle * 1000)));
    let deadline = Date.now() + idle * 1000;
    let checked = false;
    let due = await this.chunkDue(from);
    const hole = (why: string): ReplyStreamGap => new ReplyStreamGap(this.replyId, from, "", `reply ${this.replyId}: ${why}; a reader after ${after} would miss chunks (the reply's text is in the session once it ended)`);
    for (;;) {
      const got = await this.read(from, { block });
      if (got.length && !checked) {
        await this.checkGap(from);
        checked = true;
      }
      if (!got.length) {
        if (Date.now() >= deadline) throw new ReplyStreamTimeout(`no event of reply ${this.replyId} for ${idle} s`);
        continue;
      }
      deadline = Date.now() + idle * 1000;
      for (const e of got) {
        if (!KNOWN.has(e.type)) continue; // a later version's event (docs/STREAMS.md)
        if (due !== undefined && e.type === "chunk") {
          if (e.n === undefined) due = undefined;
          else if (e.n !== due) throw hole(`chunk ${e.n} came where ${due} was due (the stream was recreated or trimmed)`);
          else due++;
        }
        if (due !== undefined && e.type === "end" && e.chunks !== undefined && e.chunks > due) {
          throw hole(`the reply has ${e.chunks} chunks, ${due} were read`);
        }
        yield e;
        if (isLast(e)) return;
      }
      from = got[got.length - 1]!.id;
    }
  }

  /** The number of the next chunk due after event `after` (docs/STREAMS.md,
   * "A recreated stream"); undefined when it cannot be known; a
   * ReplyStreamGap when the stream no longer holds `after`. */
  private async chunkDue(after: string): Promise<number | undefined> {
    if (after === "0" || after === "0-0") return 0;
    const got = entries(await this.mem.send(["XREVRANGE", this.streamKey, after, "-", "COUNT", 16]));
    const [ms, seq] = idKey(after);
    const first = got[0];
    if (!first || first[0] !== `${ms}-${seq}`) {
      throw new ReplyStreamGap(this.replyId, after, first?.[0] ?? "",
        `reply ${this.replyId}: the stream no longer holds event ${after} (recreated or expired); a reader after it would miss chunks`);
    }
    for (const [id, f] of got) {
      if (f["type"] === "chunk") {
        const e = event(id, f);
        return e.n === undefined ? undefined : e.n + 1;
      }
    }
    return got.length < 16 ? 0 : undefined;
  }

  /** The chunks' texts after `after` until the end event; ReplyStreamError
   * on an error event. */
  async *chunks(after = "0", o: EventsOptions = {}): AsyncGenerator<string> {
    for await (const e of this.events(after, o)) {
      if (e.type === "error") throw new ReplyStreamError(e.text);
      if (e.type === "chunk") yield e.text;
    }
  }

  /** TTL of the stream key in seconds (-2: gone). */
  async ttlLeft(): Promise<number> {
    return Number(await this.mem.send(["TTL", this.streamKey]));
  }
}
