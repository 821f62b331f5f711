//! The messages of a session, held compactly: a fixed 24-byte head per
//! message (id, time, tokens, where its bytes end) in a ring, and every
//! message's role, meta and content back to back in one byte buffer.
//!
//! A message's bytes are `[tag][role?][meta?][content]`: the tag's low three
//! bits name a common role (0 user, 1 assistant, 2 system, 3 tool,
//! 4 developer, 5 function) or 7 for a role written out (a length byte and
//! its bytes); bit 3 says a meta follows (a LEB128 length and the JSON
//! text). The RDB format 3 writes these bytes verbatim (docs/FORMAT.md).
//!
//! Evicting the oldest message only moves a cursor; the dead bytes are
//! reclaimed when the buffer needs room. An append that does not fit goes
//! to a side buffer and is moved in by [`MessageLog::settle`] once the
//! write has trimmed, so a session at its caps reuses the space its
//! evicted message leaves instead of growing. The buffer is sized to the
//! allocator's size classes, so its capacity is what it costs.
//!
//! The buffer is shared (`Arc`): a copy of the log (a re-count snapshot
//! for a worker, a read's age-filtered view) takes no text; a write to a
//! log whose buffer is shared appends to the side buffer until it is not.

use std::collections::VecDeque;
use std::sync::Arc;

/// Roles stored as a code; others are written out.
const ROLES: [&str; 6] = [
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "function",
];
const ROLE_INLINE: u8 = 7;
const ROLE_MASK: u8 = 7;
const HAS_META: u8 = 8;
const TOOL_CODE: u8 = 3;

/// Most bytes a session's messages may hold (positions are 32-bit).
pub const MAX_LOG_BYTES: usize = u32::MAX as usize;
/// Most tokens one message may carry (stored in 32 bits; a counted message
/// has at most one token per byte plus its framing).
pub const MAX_MESSAGE_TOKENS: u64 = u32::MAX as u64;

/// Logs up to this many bytes compact whenever they need room (a memmove
/// this size costs less than counting one message); larger ones keep an
/// eighth spare so moving the live bytes is amortized over many appends.
const SMALL_LOG_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub id: u64,
    pub ts: i64,
    /// Logical position just past the message's bytes (wrapping).
    end: u32,
    pub tokens: u32,
}

/// A message as the log holds it, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageRef<'a> {
    pub id: u64,
    pub ts: i64,
    pub tokens: u64,
    pub role: &'a str,
    pub content: &'a str,
    pub meta: Option<&'a str>,
}

impl MessageRef<'_> {
    pub fn is_tool(&self) -> bool {
        self.role == super::TOOL_ROLE
    }

    /// The message as an owned value (an op, a test).
    pub fn to_message(&self) -> super::Message {
        super::Message {
            id: self.id,
            role: self.role.into(),
            content: self.content.into(),
            ts: self.ts,
            tokens: self.tokens,
            meta: self.meta.map(Box::from),
        }
    }
}

/// Why a message cannot be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogError {
    /// The session's messages would hold more than [`MAX_LOG_BYTES`].
    Full,
    /// A token count above [`MAX_MESSAGE_TOKENS`].
    Tokens,
}

#[derive(Clone, Default)]
pub struct MessageLog {
    heads: VecDeque<Head>,
    buf: Arc<Vec<u8>>,
    /// Logical position of `buf[0]`.
    start: u32,
    /// Bytes from `start` that belong to evicted messages (may reach into
    /// `extra` when all of `buf` is evicted).
    dead: usize,
    /// Messages appended after `buf` (logically contiguous with it) while
    /// `buf` was full or shared.
    extra: Vec<u8>,
    /// A read view only ([`MessageLog::view_without`]): where each message's
    /// bytes begin, as messages were left out of the middle without moving
    /// bytes. None for every log that is written.
    view_starts: Option<Box<[u32]>>,
}

/// The stored bytes of a message: tag, role, meta, content.
pub fn encode_data(role: &str, meta: Option<&str>, content: &str, out: &mut Vec<u8>) {
    let code = ROLES
        .iter()
        .position(|r| *r == role)
        .map_or(ROLE_INLINE, |c| c as u8);
    let tag = code | if meta.is_some() { HAS_META } else { 0 };
    out.push(tag);
    if code == ROLE_INLINE {
        // Roles are at most MAX_ROLE_BYTES (64), checked by every path in.
        out.push(u8::try_from(role.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(
            role.as_bytes()
                .get(..usize::from(u8::MAX))
                .unwrap_or(role.as_bytes()),
        );
    }
    if let Some(meta) = meta {
        crate::leb128::push(out, meta.len() as u64);
        out.extend_from_slice(meta.as_bytes());
    }
    out.extend_from_slice(content.as_bytes());
}

fn data_len(role: &str, meta: Option<&str>, content: &str) -> usize {
    let role_bytes = if ROLES.contains(&role) {
        0
    } else {
        1 + role.len()
    };
    let meta_bytes = meta.map_or(0, |m| crate::leb128::width(m.len() as u64) + m.len());
    1 + role_bytes + meta_bytes + content.len()
}

/// Role, meta and content of a message's stored bytes; `None` when they are
/// not a well-formed message (a corrupt load).
pub fn decode_data(data: &[u8]) -> Option<(&str, Option<&str>, &str)> {
    decode_with(data, |bytes| std::str::from_utf8(bytes).ok())
}

/// Role, meta and content of bytes the log holds, without checking UTF-8
/// again: a read of a session must not cost a pass over its text.
fn decode_stored(data: &[u8]) -> (&str, Option<&str>, &str) {
    fn trusted(bytes: &[u8]) -> Option<&str> {
        // The unit tests check what release builds take on trust.
        #[cfg(test)]
        assert!(
            std::str::from_utf8(bytes).is_ok(),
            "stored bytes split inside a character"
        );
        // SAFETY: the log holds only bytes `encode_data` wrote from `&str`s
        // (`push`) or that `check_data` decoded as UTF-8 (`push_data`,
        // `from_stored`), split at the boundaries they were written with: every
        // slice taken here is one whole string as it was written.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    }
    decode_with(data, trusted).unwrap_or(("", None, ""))
}

/// The layout of a message's stored bytes, its strings made by `text`.
fn decode_with<'a>(
    data: &'a [u8],
    text: fn(&'a [u8]) -> Option<&'a str>,
) -> Option<(&'a str, Option<&'a str>, &'a str)> {
    let (&tag, mut rest) = data.split_first()?;
    if tag & !(ROLE_MASK | HAS_META) != 0 {
        return None;
    }
    let role = match tag & ROLE_MASK {
        ROLE_INLINE => {
            let (&len, after) = rest.split_first()?;
            let (role, after) = after.split_at_checked(usize::from(len))?;
            rest = after;
            text(role)?
        }
        code => ROLES.get(usize::from(code))?,
    };
    let meta = if tag & HAS_META != 0 {
        let (len, after) = crate::leb128::take(rest).ok()?;
        rest = after;
        let (meta, after) = rest.split_at_checked(usize::try_from(len).ok()?)?;
        rest = after;
        Some(text(meta)?)
    } else {
        None
    };
    Some((role, meta, text(rest)?))
}

/// Stored bytes must be what [`encode_data`] writes for what they decode
/// to: a role with a code is never written out (the tool rule reads only
/// the code), lengths in their shortest form.
fn check_data(data: &[u8]) -> Result<(), String> {
    match decode_data(data) {
        Some((role, meta, content)) if data_len(role, meta, content) == data.len() => Ok(()),
        _ => Err("corrupt payload: malformed message bytes".to_owned()),
    }
}

/// The allocator's size class for `n` bytes (jemalloc's: 16-byte steps to
/// 128, then four per doubling), so a buffer asks for what it will get.
fn size_class(n: usize) -> usize {
    if n <= 128 {
        return n.div_ceil(16).max(1) * 16;
    }
    let floor_log2 = usize::BITS - 1 - (n - 1).leading_zeros();
    let step = 1usize << (floor_log2 - 2);
    n.div_ceil(step).saturating_mul(step)
}

impl MessageLog {
    pub fn new() -> MessageLog {
        MessageLog::default()
    }

    pub fn len(&self) -> usize {
        self.heads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Bytes from the first message's start to the end of the last one.
    fn span(&self) -> usize {
        self.buf.len() + self.extra.len()
    }

    fn live_bytes(&self) -> usize {
        self.span().saturating_sub(self.dead)
    }

    /// Whether messages of `sizes` (role, meta, content) can all be pushed,
    /// before any trimming frees room: a multi-message write checks this
    /// first, so it never fails halfway through ([`LogError::Full`]).
    pub fn has_room_for<'m>(
        &self,
        sizes: impl Iterator<Item = (&'m str, Option<&'m str>, &'m str)>,
    ) -> bool {
        let added = sizes.fold(0usize, |sum, (role, meta, content)| {
            sum.saturating_add(data_len(role, meta, content))
        });
        self.live_bytes().saturating_add(added) <= MAX_LOG_BYTES
    }

    fn begin(&self, i: usize) -> u32 {
        if let Some(start) = self.view_starts.as_ref().and_then(|starts| starts.get(i)) {
            return *start;
        }
        match i.checked_sub(1).and_then(|p| self.heads.get(p)) {
            Some(previous) => previous.end,
            None => self.start.wrapping_add(self.dead as u32),
        }
    }

    /// The stored bytes from logical position `from` to `to`.
    fn bytes(&self, from: u32, to: u32) -> &[u8] {
        let rel = from.wrapping_sub(self.start) as usize;
        let len = to.wrapping_sub(from) as usize;
        let buf = self.buf.as_slice();
        match buf.get(rel..rel + len) {
            Some(bytes) => bytes,
            None => rel
                .checked_sub(buf.len())
                .and_then(|r| self.extra.get(r..r + len))
                .unwrap_or(&[]),
        }
    }

    fn data(&self, i: usize) -> &[u8] {
        match self.heads.get(i) {
            Some(h) => self.bytes(self.begin(i), h.end),
            None => &[],
        }
    }

    /// A read-only view of the log without the messages `gone` marks (by
    /// index), sharing the stored bytes: no byte is copied, whatever was
    /// left out and wherever (a read of a session with an aged message in
    /// its middle copied the session's bytes: 20-48 ms for 40 MB). The view
    /// is read, never written.
    pub fn view_without(&self, gone: &[bool]) -> MessageLog {
        let kept = gone.iter().filter(|g| !**g).count();
        let mut heads = VecDeque::with_capacity(kept);
        let mut starts = Vec::with_capacity(kept);
        for (i, h) in self.heads.iter().enumerate() {
            if !gone.get(i).copied().unwrap_or(false) {
                starts.push(self.begin(i));
                heads.push_back(*h);
            }
        }
        MessageLog {
            heads,
            buf: Arc::clone(&self.buf),
            start: self.start,
            dead: self.dead,
            extra: self.extra.clone(),
            view_starts: Some(starts.into_boxed_slice()),
        }
    }

    /// Bytes the messages take as stored (tags, roles, metas, contents).
    pub fn stored_len(&self) -> usize {
        self.live_bytes()
    }

    /// Bytes message `i` takes as stored.
    pub fn stored_len_of(&self, i: usize) -> usize {
        self.data(i).len()
    }

    /// Whether `other` holds the very bytes this log does (a view of it).
    pub fn shares_bytes_with(&self, other: &MessageLog) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }

    pub fn head(&self, i: usize) -> Option<&Head> {
        self.heads.get(i)
    }

    /// Id, time and tokens of every message, oldest first.
    pub fn heads(&self) -> impl DoubleEndedIterator<Item = &Head> + ExactSizeIterator + '_ {
        self.heads.iter()
    }

    /// A log of `messages` in order (loading an older format).
    pub fn from_messages(messages: Vec<super::Message>) -> Result<MessageLog, String> {
        let mut log = MessageLog::new();
        for m in messages {
            log.push(m.id, m.ts, m.tokens, &m.role, m.meta.as_deref(), &m.content)
                .map_err(|e| format!("corrupt payload: message {}: {e:?}", m.id))?;
            log.settle();
        }
        Ok(log)
    }

    pub fn get(&self, i: usize) -> Option<MessageRef<'_>> {
        let h = self.heads.get(i)?;
        let (role, meta, content) = decode_stored(self.data(i));
        Some(MessageRef {
            id: h.id,
            ts: h.ts,
            tokens: u64::from(h.tokens),
            role,
            content,
            meta,
        })
    }

    pub fn front(&self) -> Option<MessageRef<'_>> {
        self.get(0)
    }

    pub fn back(&self) -> Option<MessageRef<'_>> {
        self.get(self.len().checked_sub(1)?)
    }

    /// Whether message `i` is a tool result (reads only its tag: "tool" is
    /// always stored as its code).
    pub fn is_tool(&self, i: usize) -> bool {
        self.data(i)
            .first()
            .is_some_and(|tag| tag & ROLE_MASK == TOOL_CODE)
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            log: self,
            front: 0,
            back: self.len(),
        }
    }

    /// Messages from index `from` on.
    pub fn iter_from(&self, from: usize) -> Iter<'_> {
        Iter {
            log: self,
            front: from.min(self.len()),
            back: self.len(),
        }
    }

    /// Index of the first message whose id is above `id` (ids increase).
    pub fn after_id(&self, id: u64) -> usize {
        self.heads.partition_point(|h| h.id <= id)
    }

    /// Index of message `id`.
    pub fn position(&self, id: u64) -> Option<usize> {
        let at = self.heads.partition_point(|h| h.id < id);
        self.heads.get(at).filter(|h| h.id == id).map(|_| at)
    }

    /// Tokens of the messages in `range` of indexes.
    pub fn tokens_in(&self, range: std::ops::Range<usize>) -> u64 {
        self.heads.range(range).map(|h| u64::from(h.tokens)).sum()
    }

    /// Appends a message. The caller keeps ids increasing.
    pub fn push(
        &mut self,
        id: u64,
        ts: i64,
        tokens: u64,
        role: &str,
        meta: Option<&str>,
        content: &str,
    ) -> Result<(), LogError> {
        let len = data_len(role, meta, content);
        self.reserve_position(len, tokens)?;
        let target = self.target(len);
        encode_data(role, meta, content, target);
        self.finish_push(id, ts, tokens);
        Ok(())
    }

    /// Appends a message given as its stored bytes (a loaded RDB value),
    /// checked to be well formed.
    pub fn push_data(&mut self, id: u64, ts: i64, tokens: u64, data: &[u8]) -> Result<(), String> {
        check_data(data)?;
        self.reserve_position(data.len(), tokens)
            .map_err(|e| format!("{e:?}"))?;
        self.target(data.len()).extend_from_slice(data);
        self.finish_push(id, ts, tokens);
        Ok(())
    }

    fn reserve_position(&mut self, len: usize, tokens: u64) -> Result<(), LogError> {
        if tokens > MAX_MESSAGE_TOKENS {
            return Err(LogError::Tokens);
        }
        // A caller that pushes many messages without settling (a loop of
        // pushes and evictions: a batch, an import) keeps the side buffer
        // within the live bytes; settling only then moves the live bytes at
        // most once per as many bytes appended (at live/8, a batch of
        // 1,000 x 16.5 KB at 30 messages moved 8x its size: 48-101 ms).
        if self.extra.len() >= SMALL_LOG_BYTES.max(self.live_bytes()) {
            self.settle();
        }
        if self.live_bytes().saturating_add(len) > MAX_LOG_BYTES {
            return Err(LogError::Full);
        }
        if self.span() + len > MAX_LOG_BYTES {
            self.compact();
            if self.span() + len > MAX_LOG_BYTES {
                return Err(LogError::Full);
            }
        }
        Ok(())
    }

    /// Where `len` new bytes go: the buffer when it has room and is not
    /// shared, else the side buffer.
    fn target(&mut self, len: usize) -> &mut Vec<u8> {
        let fits = self.extra.is_empty()
            && Arc::get_mut(&mut self.buf).is_some_and(|buf| buf.capacity() - buf.len() >= len);
        match Arc::get_mut(&mut self.buf) {
            Some(buf) if fits => buf,
            _ => {
                // Amortized: a loop of pushes without a settle (a rebuild,
                // a stream) must not reallocate the side buffer per push.
                self.extra.reserve(len);
                &mut self.extra
            }
        }
    }

    /// Records the message whose bytes were just written (they end the span).
    fn finish_push(&mut self, id: u64, ts: i64, tokens: u64) {
        let end = self.start.wrapping_add(self.span() as u32);
        self.heads.push_back(Head {
            id,
            ts,
            end,
            tokens: tokens as u32,
        });
    }

    /// Removes the oldest message: its `(id, tokens)`.
    pub fn pop_front(&mut self) -> Option<(u64, u64)> {
        let h = self.heads.pop_front()?;
        self.dead = h.end.wrapping_sub(self.start) as usize;
        if self.heads.is_empty() {
            self.clear_bytes();
        }
        Some((h.id, u64::from(h.tokens)))
    }

    /// Removes the newest message: its `(id, tokens)`.
    pub fn pop_back(&mut self) -> Option<(u64, u64)> {
        let h = self.heads.pop_back()?;
        if self.heads.is_empty() {
            self.clear_bytes();
        } else {
            let keep = self.begin(self.len()).wrapping_sub(self.start) as usize;
            match keep.checked_sub(self.buf.len()) {
                Some(in_extra) => self.extra.truncate(in_extra),
                None => {
                    self.extra.clear();
                    // Copies a shared buffer: only an import drops its
                    // newest message, on a session no copy shares.
                    Arc::make_mut(&mut self.buf).truncate(keep);
                }
            }
        }
        Some((h.id, u64::from(h.tokens)))
    }

    fn clear_bytes(&mut self) {
        let next = self.start.wrapping_add(self.span() as u32);
        match Arc::get_mut(&mut self.buf) {
            Some(buf) => buf.clear(),
            None => self.buf = Arc::default(),
        }
        self.extra = Vec::new();
        self.start = next;
        self.dead = 0;
    }

    /// Keeps the messages whose head `keep` accepts, in order. Dropping
    /// only the oldest ones (the usual age eviction) is a cursor move;
    /// anything else rebuilds the bytes in one buffer of the kept size.
    /// Heads only: deciding reads no text (a decode checks its UTF-8).
    pub fn retain(&mut self, keep: impl FnMut(&Head) -> bool) {
        let kept: Vec<bool> = self.heads.iter().map(keep).collect();
        let dropped_prefix = kept.iter().take_while(|k| !**k).count();
        if kept.iter().skip(dropped_prefix).all(|k| *k) {
            for _ in 0..dropped_prefix {
                self.pop_front();
            }
            self.settle();
            return;
        }
        if self.retain_in_place(&kept) {
            return;
        }
        // kept has one entry per head (built from them above): every
        // kept[i] below has i < self.len().
        let bytes: usize = (0..self.len())
            .filter(|&i| kept[i])
            .map(|i| self.data(i).len())
            .sum();
        let mut buf = Vec::with_capacity(size_class(bytes));
        let mut heads = VecDeque::with_capacity(self.len() - kept.iter().filter(|k| !**k).count());
        for (i, h) in self.heads.iter().enumerate() {
            if kept[i] {
                buf.extend_from_slice(self.data(i));
                heads.push_back(Head {
                    end: buf.len() as u32,
                    ..*h
                });
            }
        }
        *self = MessageLog {
            heads,
            buf: Arc::new(buf),
            ..MessageLog::default()
        };
    }

    /// [`MessageLog::retain`] in the buffer itself when no one shares it and
    /// every byte is in it: only the bytes after the first message that goes
    /// move, once (an aged message just before the newest, in a 40 MB
    /// session, made the next write rebuild the whole buffer: 26-52 ms).
    /// False (nothing done) otherwise.
    fn retain_in_place(&mut self, kept: &[bool]) -> bool {
        if !self.extra.is_empty() || self.view_starts.is_some() {
            return false;
        }
        let Some(first_gone) = kept.iter().position(|k| !*k) else {
            return true;
        };
        let start = self.start;
        let ranges: Vec<(usize, usize)> = (0..self.len())
            .map(|i| {
                let end = self.heads.get(i).map_or(start, |h| h.end);
                (
                    self.begin(i).wrapping_sub(start) as usize,
                    end.wrapping_sub(start) as usize,
                )
            })
            .collect();
        let Some(buf) = Arc::get_mut(&mut self.buf) else {
            return false;
        };
        // first_gone indexes kept, whose length is that of ranges.
        let mut write = ranges[first_gone].0;
        for (i, &(from, to)) in ranges.iter().enumerate().skip(first_gone) {
            if !kept[i] {
                continue;
            }
            buf.copy_within(from..to, write);
            write += to - from;
            if let Some(h) = self.heads.get_mut(i) {
                h.end = start.wrapping_add(write as u32);
            }
        }
        buf.truncate(write);
        let mut i = 0;
        self.heads.retain(|_| {
            i += 1;
            kept[i - 1]
        });
        if self.heads.is_empty() {
            self.clear_bytes();
        }
        true
    }

    /// Sets message `i`'s tokens (a re-count). Counts come from a count of
    /// the message's bytes, so they fit.
    pub fn set_tokens(&mut self, i: usize, tokens: u64) {
        if let Some(h) = self.heads.get_mut(i) {
            h.tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        }
    }

    /// Moves the buffer's live bytes to its front.
    fn compact(&mut self) {
        let Some(buf) = Arc::get_mut(&mut self.buf) else {
            return;
        };
        if self.dead >= buf.len() {
            let rest = self.dead - buf.len();
            self.start = self.start.wrapping_add(buf.len() as u32);
            *buf = std::mem::take(&mut self.extra);
            self.dead = rest;
        }
        if self.dead > 0 {
            let dead = self.dead.min(buf.len());
            buf.drain(..dead);
            self.start = self.start.wrapping_add(dead as u32);
            self.dead -= dead;
        }
    }

    /// Brings the side buffer into the buffer and sizes the buffer to what
    /// it holds; called once a write is done (it has trimmed). Reads are
    /// right before and after: this only moves bytes.
    pub fn settle(&mut self) {
        // Heads too: a summary of 100,000 messages down to 100 would keep
        // 3 MB of ring. Shrunk to twice what is held, so appends that
        // follow do not reallocate at once.
        if self.heads.capacity() > 64 && self.heads.capacity() > 4 * self.heads.len() {
            self.heads.shrink_to(2 * self.heads.len());
        }
        if Arc::get_mut(&mut self.buf).is_none() {
            self.release_dead_shared();
            if Arc::get_mut(&mut self.buf).is_none() {
                return;
            }
        }
        let live = self.live_bytes();
        let slack = if live > SMALL_LOG_BYTES { live / 8 } else { 0 };
        if !self.extra.is_empty() {
            self.compact();
            let Some(buf) = Arc::get_mut(&mut self.buf) else {
                return;
            };
            if buf.is_empty() {
                *buf = std::mem::take(&mut self.extra);
            } else if !self.extra.is_empty() {
                // Keep an eighth spare once compacted, so the next move of
                // the live bytes is at least live/8 appended bytes away (a
                // buffer the last growth left nearly full would move them
                // on every append at the caps). A reallocation the
                // allocator can extend in place copies nothing.
                let need = buf.len() + self.extra.len();
                if need + slack > buf.capacity() {
                    buf.reserve_exact(size_class(need + slack) - buf.len());
                }
                buf.extend_from_slice(&self.extra);
                self.extra = Vec::new();
            }
        }
        // Give back what a summary or a large eviction freed.
        let Some(buf) = Arc::get_mut(&mut self.buf) else {
            return;
        };
        let fits = size_class(live + slack);
        if buf.capacity() > 4096 && buf.capacity() > 2 * fits {
            self.compact();
            if let Some(buf) = Arc::get_mut(&mut self.buf) {
                buf.shrink_to(fits);
            }
        }
    }

    /// Drops this log's hold on a shared buffer once every byte of it is
    /// evicted: its live bytes are all in the side buffer, which becomes
    /// the buffer. Without this, a log whose buffer stays shared (a COPY, a
    /// long re-count) at its caps would keep every evicted byte of its side
    /// buffer, since only an unshared buffer is compacted.
    fn release_dead_shared(&mut self) {
        if self.dead >= self.buf.len() {
            self.start = self.start.wrapping_add(self.buf.len() as u32);
            self.dead -= self.buf.len();
            self.buf = Arc::new(std::mem::take(&mut self.extra));
        }
    }

    /// A copy that shares nothing with this log (COPY: two keys, each
    /// compacting its own bytes; MEMORY USAGE of each is what it holds).
    pub fn detached(&self) -> MessageLog {
        let (a, b) = self.stored_bytes();
        let mut buf = Vec::with_capacity(size_class(a.len() + b.len()));
        buf.extend_from_slice(a);
        buf.extend_from_slice(b);
        MessageLog {
            heads: self.heads.clone(),
            buf: Arc::new(buf),
            start: self.start.wrapping_add(self.dead as u32),
            dead: 0,
            extra: Vec::new(),
            view_starts: None,
        }
    }

    /// A copy sharing this log's bytes (taking no text): a worker may read
    /// it while this one changes.
    pub fn shared_copy(&mut self) -> MessageLog {
        self.settle();
        self.clone()
    }

    /// Changes message `i` (tests: stored values no command can make).
    #[cfg(test)]
    pub fn edit(&mut self, i: usize, change: impl FnOnce(&mut super::Message)) {
        let mut messages: Vec<super::Message> = self.iter().map(|m| m.to_message()).collect();
        if let Some(m) = messages.get_mut(i) {
            change(m);
        }
        *self = MessageLog::from_messages(messages).unwrap();
    }

    /// Bytes held, for MEMORY USAGE.
    /// Allocations are counted at their size class: what the allocator
    /// hands out, so MEMORY USAGE agrees with used_memory.
    pub fn mem_usage(&self) -> usize {
        let allocation = |bytes: usize| if bytes == 0 { 0 } else { size_class(bytes) };
        allocation(self.heads.capacity() * std::mem::size_of::<Head>())
            + allocation(2 * std::mem::size_of::<usize>() + std::mem::size_of::<Vec<u8>>())
            + allocation(self.buf.capacity())
            + allocation(self.extra.capacity())
    }

    /// Heads and stored bytes of every message in order, for RDB format 3.
    pub fn stored(&self) -> impl Iterator<Item = (&Head, &[u8])> + '_ {
        self.heads
            .iter()
            .enumerate()
            .map(|(i, h)| (h, self.data(i)))
    }

    /// The stored bytes of every message, as one or two slices.
    pub fn stored_bytes(&self) -> (&[u8], &[u8]) {
        let dead_in_buf = self.dead.min(self.buf.len());
        let buf = self.buf.get(dead_in_buf..).unwrap_or(&[]);
        let extra = self.extra.get(self.dead - dead_in_buf..).unwrap_or(&[]);
        (buf, extra)
    }

    /// A log from RDB format 3: heads as stored (each message's length in
    /// bytes instead of its position) and the concatenated bytes.
    pub fn from_stored(
        heads: Vec<(u64, i64, u64, usize)>,
        bytes: &[u8],
    ) -> Result<MessageLog, String> {
        let mut log = MessageLog {
            heads: VecDeque::with_capacity(heads.len()),
            ..MessageLog::default()
        };
        let mut at = 0usize;
        for (id, ts, tokens, len) in heads {
            let data = bytes
                .get(at..at.saturating_add(len))
                .ok_or_else(|| "corrupt payload: message bytes past the end".to_owned())?;
            check_data(data)?;
            if tokens > MAX_MESSAGE_TOKENS {
                return Err(format!("corrupt payload: message tokens {tokens}"));
            }
            at += len;
            log.heads.push_back(Head {
                id,
                ts,
                end: at as u32,
                tokens: tokens as u32,
            });
        }
        if at != bytes.len() {
            return Err("corrupt payload: message bytes left over".to_owned());
        }
        if bytes.len() > MAX_LOG_BYTES {
            return Err("corrupt payload: messages above 4 GiB".to_owned());
        }
        // Sized to its allocation class: the spare bytes take appends.
        let mut buf = Vec::with_capacity(size_class(bytes.len()));
        buf.extend_from_slice(bytes);
        log.buf = Arc::new(buf);
        Ok(log)
    }
}

impl PartialEq for MessageLog {
    fn eq(&self, other: &MessageLog) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for MessageLog {}

impl std::fmt::Debug for MessageLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[derive(Clone)]
pub struct Iter<'a> {
    log: &'a MessageLog,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = MessageRef<'a>;

    fn next(&mut self) -> Option<MessageRef<'a>> {
        if self.front >= self.back {
            return None;
        }
        let m = self.log.get(self.front);
        self.front += 1;
        m
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.log.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
