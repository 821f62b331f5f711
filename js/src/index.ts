export { RedisMem, newMsgId, MAX_MSGID_BYTES } from "./client.js";
export type {
  AppendOptions, BatchMessage, CheckOptions, GetOptions, ImportOptions, Meta, RedisMemOptions, SessionSettings,
} from "./client.js";
export { RedisMemError, RedisMemReplyError } from "./errors.js";
export { transportOf } from "./adapter.js";
export type { AnyClient, Arg, IoRedisLike, NodeRedisClusterLike, NodeRedisLike, Transport } from "./adapter.js";
export { SUMMARY_ROLE } from "./replies.js";
export type {
  AppendResult, JsonObject, Message, ModelEntry, ModelInfo, SessionInfo, SummarizeBegin, SummarizeCheck,
} from "./replies.js";
export {
  DEFAULT_MAXLEN, DEFAULT_TTL, ReplyStream, ReplyStreamError, ReplyStreamGap, ReplyStreamTimeout, isLast,
  replyStreamKey, validEventId,
} from "./reply-stream.js";
export type { EventsOptions, ReadOptions, ReplyEvent, ReplyEventType, ReplyStreamOptions } from "./reply-stream.js";
export {
  UI_MESSAGE_STREAM_HEADERS, loadUIMessages, saveUIMessages, uiMessageChunks, uiMessageStreamResponse, uiMessageText,
  writeUIMessageStream,
} from "./ai-sdk.js";
export type { ReplyUIChunk, TextUIMessage, UIChunkLike, UIMessageLike } from "./ai-sdk.js";
