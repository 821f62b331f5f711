// The module's size limit as the package's writers apply it: one marker and
// one cut for the middleware and reply streams (the Python wording).

/** mem.max-message-bytes when CONFIG GET is refused (the module's default). */
export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** Appended to a message stored truncated ({kept} and {size} in bytes). */
export const TRUNCATED_MARKER = "\n[redis-mem: truncated to {kept} of {size} bytes (over mem.max-message-bytes)]";

/** `text` cut to at most `limit` UTF-8 bytes with the marker, and its size;
 * `[text, 0]` when it fits. */
export function truncate(text: string, limit: number, template = TRUNCATED_MARKER): [string, number] {
  const marker = (kept: number, size: number): string =>
    template.replace("{kept}", String(kept)).replace("{size}", String(size));
  const raw = Buffer.from(text, "utf8");
  if (raw.length <= limit) return [text, 0];
  let keep = Math.max(0, limit - Buffer.byteLength(marker(raw.length, raw.length)));
  while (keep > 0 && (raw[keep]! & 0xc0) === 0x80) keep--; // never inside a character
  return [raw.subarray(0, keep).toString("utf8") + marker(keep, raw.length), raw.length];
}

/** The value of a `CONFIG GET name` reply (RESP2 array, RESP3 map, or an
 * object), undefined when absent. */
export function configValue(reply: unknown, name: string): string | undefined {
  const v = reply instanceof Map ? [...reply.values()][0]
    : Array.isArray(reply) ? reply[1] : (reply as Record<string, unknown> | null)?.[name];
  return v === undefined || v === null ? undefined : String(v);
}
