// A Next.js-style chat route for the Vercel AI SDK's useChat on redis-mem:
// POST streams the reply through Redis (a ReplyStream) and stores each turn
// once (the UIMessage id / the reply id as MSGID); GET is useChat's `resume`
// (`GET /api/chat/<id>/stream`): 204 when no reply is in flight, else the
// reply from its first event, on any process. `npm test` drives it with the
// SDK's mock model (test/ai-sdk.test.ts).
//
//   // app/api/chat/route.ts, app/api/chat/[id]/stream/route.ts
//   const routes = chatRoutes({ mem, reader, model: openai("gpt-4o") });
//   export const POST = routes.POST;                       // and GET for resume
import { streamText, type LanguageModel, type ModelMessage, type UIMessage } from "ai";
import { RedisMem, ReplyStream, uiMessageStreamResponse, writeUIMessageStream } from "redis-mem";

export interface ChatRoutes {
  POST(req: Request): Promise<Response>;
  GET(req: Request, chatId: string): Promise<Response>;
  /** The replies being written (await them before exiting, e.g. Next.js `after()`). */
  pending: Set<Promise<unknown>>;
}

const textOf = (m: UIMessage): string => m.parts.map((p) => (p.type === "text" ? p.text : "")).join("");

/** `mem` writes; `reader` (its own connection: readers block) reads replies. */
export function chatRoutes(o: { mem: RedisMem; reader: RedisMem; model: LanguageModel; budget?: number }): ChatRoutes {
  const { mem, reader, model } = o;
  const pending = new Set<Promise<unknown>>();
  return {
    pending,
    async POST(req) {
      const { id, messages } = (await req.json()) as { id: string; messages: UIMessage[] };
      const key = `mem:{${id}}`;
      const last = messages.at(-1);
      if (last?.role === "user") await mem.append(key, "user", textOf(last), { msgId: last.id }); // once, even resent
      const context: ModelMessage[] = (await mem.get(key, { budget: o.budget ?? 8000 })).map((m) =>
        m.isSummary || m.role === "system"
          ? { role: "system", content: m.content }
          : { role: m.role === "assistant" ? "assistant" : "user", content: m.content });
      const reply = new ReplyStream(mem, key);
      await mem.attrSet(key, "active_reply", reply.replyId, { ex: reply.ttl });
      const result = streamText({ model, messages: context });
      const writing = writeUIMessageStream(reply, result.toUIMessageStream())
        .finally(() => mem.attrDel(key, "active_reply"))
        .catch(() => undefined) // an error event already tells the readers
        .finally(() => pending.delete(writing));
      pending.add(writing);
      return uiMessageStreamResponse(new ReplyStream(reader, key, { replyId: reply.replyId }));
    },
    async GET(_req, chatId) {
      const key = `mem:{${chatId}}`;
      const replyId = await mem.attrGet(key, "active_reply");
      if (typeof replyId !== "string") return new Response(null, { status: 204 });
      return uiMessageStreamResponse(new ReplyStream(reader, key, { replyId }));
    },
  };
}
