// The Vercel AI SDK's UI message stream (useChat's wire format) on a
// ReplyStream: a reply written from `streamText(...).toUIMessageStream()`, and
// read back as UI message chunks or as the SSE Response useChat's resume
// expects. Structural types only: no runtime dependency on `ai`.
import { createHash } from "node:crypto";
import { type EventsOptions, type ReplyEvent, ReplyStream, validEventId } from "./reply-stream.js";
import { type GetOptions, MAX_MSGID_BYTES, NAME_BREAKER, type RedisMem, type SessionSettings, ownMsgId } from "./client.js";
import type { AppendResult, JsonObject } from "./replies.js";

/** The UI message chunks this module writes: a subset of the AI SDK's
 * `UIMessageChunk` (assignable to it). */
export type ReplyUIChunk =
  | { type: "start"; messageId: string }
  | { type: "text-start"; id: string }
  | { type: "text-delta"; id: string; delta: string }
  | { type: "text-end"; id: string }
  | { type: "finish" }
  | { type: "error"; errorText: string };

/** Any AI SDK UI message chunk, as far as writing a reply needs. */
export interface UIChunkLike {
  type: string;
  delta?: string;
  errorText?: string;
}

async function* iterate<T>(src: AsyncIterable<T> | Iterable<T> | ReadableStream<T>): AsyncGenerator<T> {
  if (Symbol.asyncIterator in src || Symbol.iterator in src) {
    yield* src as AsyncIterable<T> | Iterable<T>;
    return;
  }
  const reader = (src as ReadableStream<T>).getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.releaseLock();
  }
}

/**
 * Writes a UI message stream (`streamText(...).toUIMessageStream()`, or any
 * iterable of its chunks) into `reply`: each `text-delta` as a chunk, then
 * `finish()` (the text stored once as the session's assistant message, MSGID
 * the reply id) when the stream ends, or `error()` on an `error` chunk.
 * Only text is kept (tool and reasoning chunks are not part of the layout).
 * Returns the last event (end or error).
 */
export async function writeUIMessageStream(
  reply: ReplyStream, chunks: AsyncIterable<UIChunkLike> | Iterable<UIChunkLike> | ReadableStream<UIChunkLike>, o: { meta?: JsonObject } = {},
): Promise<ReplyEvent> {
  try {
    for await (const c of iterate(chunks)) {
      if (c.type === "text-delta" && c.delta) await reply.write(c.delta);
      else if (c.type === "error") return await reply.error(c.errorText ?? "error");
      // An aborted reply is not an answer: an error event, nothing stored.
      else if (c.type === "abort") return await reply.error("aborted");
    }
  } catch (e) {
    if (!reply.finished) await reply.error(e instanceof Error ? e.message : String(e));
    throw e;
  }
  return reply.finish(o.meta ? { meta: o.meta } : {});
}

/**
 * The reply as AI SDK UI message chunks: `start` (messageId: the reply id),
 * `text-start`, a `text-delta` per chunk after `after`, then `text-end` and
 * `finish` (or `error`). Each chunk with the event id it came from (`eventId`,
 * undefined for the opening ones).
 */
export async function* uiMessageChunks(
  reply: ReplyStream, after = "0", o: EventsOptions = {},
): AsyncGenerator<{ chunk: ReplyUIChunk; eventId?: string }> {
  const id = reply.replyId;
  yield { chunk: { type: "start", messageId: id } };
  yield { chunk: { type: "text-start", id } };
  try {
    for await (const e of reply.events(after, o)) {
      if (e.type === "chunk") yield { chunk: { type: "text-delta", id, delta: e.text }, eventId: e.id };
      else if (e.type === "error") yield { chunk: { type: "error", errorText: e.text }, eventId: e.id };
      else if (e.type === "end") {
        yield { chunk: { type: "text-end", id }, eventId: e.id };
        yield { chunk: { type: "finish" }, eventId: e.id };
      }
    }
  } catch (e) {
    yield { chunk: { type: "error", errorText: e instanceof Error ? e.message : String(e) } };
  }
}

/** The headers of an AI SDK UI message stream response. */
export const UI_MESSAGE_STREAM_HEADERS: Record<string, string> = {
  "content-type": "text/event-stream",
  "cache-control": "no-cache",
  connection: "keep-alive",
  "x-vercel-ai-ui-message-stream": "v1",
  "x-accel-buffering": "no",
};

/**
 * The reply as the SSE `Response` useChat reads (`DefaultChatTransport`: a
 * chat request's answer, or `resume`'s GET): `data: <chunk JSON>` events,
 * each with `id: <event id>` (a client's `Last-Event-ID`, to pass as
 * `after`), closed by `data: [DONE]`. The AI SDK's resume replays a reply
 * from the start: keep `after` "0" for it.
 */
export function uiMessageStreamResponse(
  reply: ReplyStream, o: EventsOptions & { after?: string; status?: number; headers?: Record<string, string> } = {},
): Response {
  let after: string;
  try {
    after = validEventId(o.after);
  } catch {
    // A client's Last-Event-ID is input: refused before anything is read.
    return new Response(`not an event id: ${JSON.stringify(String(o.after)).slice(0, 80)}\n`, { status: 400, headers: { "content-type": "text/plain" } });
  }
  const enc = new TextEncoder();
  const it = uiMessageChunks(reply, after, o);
  const body = new ReadableStream<Uint8Array>({
    async pull(ctrl) {
      const { done, value } = await it.next();
      if (done) {
        ctrl.enqueue(enc.encode("data: [DONE]\n\n"));
        ctrl.close();
        return;
      }
      const idLine = value.eventId ? `id: ${value.eventId}\n` : "";
      ctrl.enqueue(enc.encode(`${idLine}data: ${JSON.stringify(value.chunk)}\n\n`));
    },
    async cancel() {
      await it.return(undefined);
    },
  });
  return new Response(body, { status: o.status ?? 200, headers: { ...UI_MESSAGE_STREAM_HEADERS, ...(o.headers ?? {}) } });
}

// ---------------------------------------------------------------------------
// A chat store: a session's messages as AI SDK UIMessages, and back.
// ---------------------------------------------------------------------------

/** A text-only AI SDK `UIMessage` (assignable to `UIMessage`). */
export interface TextUIMessage {
  id: string;
  role: "system" | "user" | "assistant";
  parts: Array<{ type: "text"; text: string }>;
  metadata?: { summary?: true; ts: number };
}

/** Any AI SDK `UIMessage`, as far as storing it needs (its text parts). */
export interface UIMessageLike {
  id: string;
  role: string;
  parts: ReadonlyArray<{ type: string; text?: string }>;
}

/** The text of a UIMessage (its text parts, joined). */
export function uiMessageText(m: UIMessageLike): string {
  return m.parts.map((p) => (p.type === "text" && typeof p.text === "string" ? p.text : "")).join("");
}

/** A chat's messages for useChat's `messages` (a page load): the session's
 * summary as a system message (metadata.summary), then its messages, each
 * with its MSGID as id (its session id when it has none). Tool results and
 * other roles than system/user/assistant are left out (text only). */
export async function loadUIMessages(
  mem: RedisMem, key: string, o: GetOptions = {},
): Promise<TextUIMessage[]> {
  const out: TextUIMessage[] = [];
  for (const m of await mem.get(key, o)) {
    const role = m.isSummary ? "system" : m.role;
    if (role !== "system" && role !== "user" && role !== "assistant") continue;
    const ui: TextUIMessage = {
      id: m.isSummary ? `summary-${m.id}` : (m.msgId ?? String(m.id)),
      role,
      parts: [{ type: "text", text: m.content }],
      metadata: m.isSummary ? { summary: true, ts: m.ts } : { ts: m.ts },
    };
    out.push(ui);
  }
  return out;
}

/** Saves a chat's UIMessages (what useChat sends, or `onFinish`'s
 * `messages`): those after the newest message the session holds or let go
 * last, in MEM.APPENDBATCHes, each message's id as its MSGID (one made from
 * its place and text when it has none), so they are stored once however often
 * the whole list is saved. Text parts only; messages without text are
 * skipped. Messages are only ever added: a regenerated answer or an edited
 * turn (under `<id>~<hash of its text>`) is appended after the branch it
 * replaces, which stays in the session; `warn` (default console.warn) is told
 * when that happens. */
export async function saveUIMessages(
  mem: RedisMem, key: string, messages: readonly UIMessageLike[],
  settings: SessionSettings = {}, o: { warn?: (message: string) => void } = {},
): Promise<AppendResult[]> {
  // Only what follows the newest message the session holds or let go last:
  // the module remembers 128 departed MSGIDs, so a long chat saved whole
  // each turn would otherwise store its oldest messages again as new ones,
  // and one whose messages all aged out (MAXAGE) would store them all again
  // (hostile pass 58 F1). A message held under its id with another text was
  // edited (useChat's sendMessage({ messageId })): it is not stored, and
  // goes in under an id of its own (hostile pass 59 F4). A message without
  // an id (onFinish's answer without generateMessageId) gets one from its
  // place and text: an empty MSGID refused the whole save (pass 59 F5).
  const { held: order, departed, texts } = await mem.msgIds(key);
  const seen = new Set([...order, ...departed]);
  const text = (m: UIMessageLike): string => Buffer.from(uiMessageText(m)).toString(); // as stored: U+FFFD for a lone surrogate
  // An id the module refuses as a MSGID (over 128 bytes, a control
  // character) is hashed, as the middleware does: it refused the whole save
  // (hostile pass 60 F6).
  const hash = (t: string): string => createHash("sha256").update(t).digest("hex");
  const ids = messages.map((m, i) => (!m.id ? `ui:${hash(`${key}\0${i}\0${m.role}\0${text(m)}`).slice(0, 32)}`
    : Buffer.byteLength(m.id) > MAX_MSGID_BYTES || NAME_BREAKER.test(m.id) ? `sha256:${hash(m.id)}` : m.id));
  // Only a user turn is edited (useChat's sendMessage({ messageId })); an
  // answer saved again with more text is the same answer (pass 60 F5).
  const edited = messages.map((m, i) => m.role === "user" && texts.has(ids[i]!) && texts.get(ids[i]!) !== text(m));
  const msgIds = messages.map((m, i) => (edited[i]
    ? ownMsgId(ids[i]!, hash(text(m)).slice(0, 16)) : ids[i]!));
  let from = messages.length;
  while (from > 0 && !seen.has(msgIds[from - 1]!)) from--;
  const listed = new Set(msgIds);
  const anchor = from > 0 ? order.lastIndexOf(msgIds[from - 1]!) : -1;
  const stale = order.slice(anchor + 1).filter((id) => !listed.has(id));
  const warn = o.warn ?? ((m: string) => console.warn(m));
  if (stale.length && from < messages.length) {
    warn(`redis-mem: ${key} holds ${stale.length} message(s) the chat no longer has `
      + `(${stale.slice(0, 3).join(", ")}${stale.length > 3 ? ", ..." : ""}: a regenerated answer or an edited turn); `
      + "they stay in the session, the new ones are added after them");
  }
  const batch = messages.slice(from).map((m, k) => {
    const i = from + k;
    if (edited[i] && !seen.has(msgIds[i]!)) {
      warn(`redis-mem: ${key}: message ${ids[i]} was edited; the new text is stored after what the session holds, as ${msgIds[i]}`);
    }
    return { m, msgId: msgIds[i]! };
  })
    .filter(({ m }) => !(m.role === "system" && m.id.startsWith("summary-"))) // the summary loadUIMessages gave
    .map(({ m, msgId }) => ({ role: m.role, content: uiMessageText(m), msgId }))
    .filter((m) => m.content !== "");
  const out: AppendResult[] = [];
  for (let i = 0; i < batch.length; i += 1000) out.push(...await mem.appendBatch(key, batch.slice(i, i + 1000), settings));
  return out;
}
