/** A reply error from Redis (or the module), keeping its error code. */
export class RedisMemError extends Error {
  /** The error code: the first word of the reply, e.g. `ERR`, `WRONGTYPE`,
   * `TRYAGAIN`, `BUSYKEY`, `LEASED`. */
  readonly code: string;
  /** The command that failed (`MEM.APPEND`, ...). */
  readonly command: string;

  constructor(message: string, command: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "RedisMemError";
    const m = /^([A-Z][A-Z0-9_-]*)\b/.exec(message);
    this.code = m ? m[1]! : "ERR";
    this.command = command;
  }
}

/** A reply that does not have the shape the module documents. */
export class RedisMemReplyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RedisMemReplyError";
  }
}
