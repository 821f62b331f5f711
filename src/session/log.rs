//! The messages of a session, held compactly: a head per message (id,
//! time, tokens, where its bytes end; 12 bytes while the ids run without a
//! gap, `heads.rs`) in a ring, and every
//! message's role, meta and content back to back in segments of up to
//! 8 KiB (a larger message has one of its own).
//!
//! A message's bytes are `[tag][role?][meta?][content]`: the tag's low three
//! bits name a common role (0 user, 1 assistant, 2 system, 3 tool,
//! 4 developer, 5 function) or 7 for a role written out (a length byte and
//! its bytes); bit 3 says a meta follows (a LEB128 length and the JSON
//! text). The RDB format 3 writes these bytes verbatim (docs/FORMAT.md).
//!
//! Evicting the oldest message only moves a cursor; a segment goes when all
//! of its messages have, and the first one is compacted once a third of it is
//! evicted. A log of one segment at its caps reuses the space its evicted
//! message leaves instead of growing. Segments are sized to the allocator's
//! size classes, so their capacity is what they cost, and no write moves
//! more than one segment's bytes however large the session.
//!
//! Segments are shared (`Arc`): a copy of the log (a re-count snapshot for
//! a worker, a read's age-filtered view) takes no text; a write to a shared
//! segment copies that segment.

use std::collections::VecDeque;

pub use super::heads::Head;
use super::heads::Heads;
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
            meta: self.meta.map(Arc::from),
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

/// Most bytes a segment of several messages holds. A growing log copies at
/// most this many bytes at a time (one buffer that grew by copying itself
/// held the main thread 36-82 ms on a 40-80 MB session's next append), and
/// the allocator's classes up to here are at most 1 KiB apart, so a log
/// costs about what it holds (an 18 KB buffer took a 20 KB class).
const SEGMENT_BYTES: usize = 8 * 1024;

/// A run of whole messages' bytes. Shared (`Arc`): a copy of the log (a
/// re-count snapshot for a worker, a read's age-filtered view) takes no
/// text; a write to a shared segment copies that segment only.
#[derive(Clone)]
struct Segment {
    /// Logical position of `bytes[0]`.
    start: u32,
    bytes: Arc<Vec<u8>>,
}

impl Segment {
    fn end(&self) -> u32 {
        self.start.wrapping_add(self.bytes.len() as u32)
    }

    fn owned(start: u32, capacity: usize) -> Segment {
        Segment {
            start,
            bytes: Arc::new(Vec::with_capacity(capacity)),
        }
    }

    /// A segment holding `bytes`, sized to the allocator's class for them.
    fn copied(start: u32, bytes: &[u8]) -> Segment {
        Segment {
            start,
            bytes: Arc::new(fitted(bytes)),
        }
    }
}

#[derive(Clone, Default)]
pub struct MessageLog {
    heads: Heads,
    /// The messages' bytes, logically contiguous and in order. A message's
    /// bytes are in one segment; a segment over [`SEGMENT_BYTES`] was made
    /// for one message (smaller ones may fill its class's spare room). Only
    /// the first may begin with evicted bytes.
    segments: VecDeque<Segment>,
    /// Logical position where the first message's bytes begin (where the
    /// next message's go when there is none).
    first: u32,
    /// A read view only ([`MessageLog::view_without`]): where each message's
    /// bytes begin, as messages were left out of the middle without moving
    /// bytes. None for every log that is written.
    /// Boxed twice to keep the pointer thin: every session holds the
    /// field, and 8 bytes more put a session in the next size class.
    #[allow(clippy::box_collection)]
    view_starts: Option<Box<Vec<u32>>>,
}

/// Segments at least this large that a write drops are freed off the main
/// thread (session/garbage.rs): 250 messages of 4 MB evicted or summarized
/// at once held it 64-88 ms freeing them (hostile pass 30 F5).
const FREE_LATER_BYTES: usize = 1 << 20;

/// Drops a segment a write no longer holds: a large one is set aside to be
/// freed off the main thread (it may still be shared with a copy: the last
/// holder frees it).
fn discard(segment: Segment) {
    if segment.bytes.capacity() >= FREE_LATER_BYTES {
        super::garbage::discard(segment.bytes);
    }
}

/// A message's stored bytes built ahead of its write, off the main thread,
/// in an allocation of their size class, for [`MessageLog::push_prepared`]
/// to keep as the message's own segment. A 4 MB message's copy into a fresh
/// segment was most of MEM.APPEND's main-thread time (its page faults).
#[derive(Debug)]
pub struct Prepared(Vec<u8>);

impl Prepared {
    /// The stored bytes of a message too large to share a segment; None
    /// for a smaller one (copied into a segment where it is written).
    pub fn of(role: &str, meta: Option<&str>, content: &str) -> Option<Prepared> {
        let len = data_len(role, meta, content);
        if len <= SEGMENT_BYTES {
            return None;
        }
        let mut bytes = Vec::with_capacity(size_class(len));
        encode_data(role, meta, content, &mut bytes);
        Some(Prepared(bytes))
    }
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
    decode_with(data, crate::utf8::str)
}

/// Role, meta and content of bytes the log holds, without checking UTF-8
/// again: a read of a session must not cost a pass over its text.
fn decode_stored(data: &[u8]) -> (&str, Option<&str>, &str) {
    fn trusted(bytes: &[u8]) -> Option<&str> {
        // The unit tests check what release builds take on trust.
        #[cfg(test)]
        assert!(
            crate::utf8::str(bytes).is_some(),
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

/// The message of head `h` and its stored bytes.
fn message(h: Head, data: &[u8]) -> MessageRef<'_> {
    let (role, meta, content) = decode_stored(data);
    MessageRef {
        id: h.id,
        ts: h.ts,
        tokens: u64::from(h.tokens),
        role,
        content,
        meta,
    }
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

/// A copy of `bytes` in an allocation of their size class.
fn fitted(bytes: &[u8]) -> Vec<u8> {
    let mut copy = Vec::with_capacity(size_class(bytes.len()));
    copy.extend_from_slice(bytes);
    copy
}

/// The runs of whole messages a log lays out as one segment each, in
/// order, given the messages' ends (logical positions after `start`): as
/// many messages as fit in [`SEGMENT_BYTES`], at least one. `run` gets each
/// run's first and past-the-end positions and its number of messages.
fn for_each_run(start: u32, ends: impl Iterator<Item = u32>, mut run: impl FnMut(u32, u32, usize)) {
    let (mut from, mut at, mut n) = (start, start, 0usize);
    for end in ends {
        if n > 0 && end.wrapping_sub(from) as usize > SEGMENT_BYTES {
            run(from, at, n);
            (from, n) = (at, 0);
        }
        at = end;
        n += 1;
    }
    if n > 0 {
        run(from, at, n);
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

    /// Logical position just past the last message's bytes.
    fn end(&self) -> u32 {
        self.heads.back_end().unwrap_or(self.first)
    }

    /// Logical position of the first segment's first byte.
    fn base(&self) -> u32 {
        self.segments.front().map_or(self.first, |s| s.start)
    }

    /// Bytes from the first segment's start to the end of the last message.
    fn span(&self) -> usize {
        self.end().wrapping_sub(self.base()) as usize
    }

    fn live_bytes(&self) -> usize {
        self.end().wrapping_sub(self.first) as usize
    }

    /// Evicted bytes at the start of the first segment.
    fn dead(&self) -> usize {
        self.first.wrapping_sub(self.base()) as usize
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
            None => self.first,
        }
    }

    /// The stored bytes from logical position `from` to `to` (one message:
    /// they are in one segment).
    fn bytes(&self, from: u32, to: u32) -> &[u8] {
        let holds = |s: &&Segment| (from.wrapping_sub(s.start) as usize) < s.bytes.len();
        // The oldest messages (evictions, tool groups at the front) and the
        // newest (appends, reads of the last ones) without a search.
        let ends = [
            self.segments.front(),
            self.segments.get(1),
            self.segments.back(),
        ];
        let found = ends.into_iter().flatten().find(holds).or_else(|| {
            let base = self.base();
            let rel = from.wrapping_sub(base);
            let after = self
                .segments
                .partition_point(|s| s.start.wrapping_sub(base) <= rel);
            after.checked_sub(1).and_then(|k| self.segments.get(k))
        });
        let Some(segment) = found else {
            return &[];
        };
        let at = from.wrapping_sub(segment.start) as usize;
        let len = to.wrapping_sub(from) as usize;
        segment.bytes.get(at..at.saturating_add(len)).unwrap_or(&[])
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
        let mut heads = Heads::with_capacity(kept);
        let mut starts = Vec::with_capacity(kept);
        for (i, h) in self.heads.iter().enumerate() {
            if !gone.get(i).copied().unwrap_or(false) {
                starts.push(self.begin(i));
                heads.push_back(h);
            }
        }
        MessageLog {
            heads,
            segments: self.segments.clone(),
            first: self.first,
            view_starts: Some(Box::new(starts)),
        }
    }

    /// Bytes the messages take as stored (tags, roles, metas, contents).
    pub fn stored_len(&self) -> usize {
        self.live_bytes()
    }

    /// Bytes message `i` takes as stored, from its head and the one before
    /// (no look at the bytes: a model switch asks it of every message, and
    /// finding each one's segment cost a cache miss per message).
    pub fn stored_len_of(&self, i: usize) -> usize {
        self.heads
            .get(i)
            .map_or(0, |h| h.end.wrapping_sub(self.begin(i)) as usize)
    }

    /// Whether `other` holds the very bytes this log does (a view of it).
    pub fn shares_bytes_with(&self, other: &MessageLog) -> bool {
        self.segments.len() == other.segments.len()
            && self
                .segments
                .iter()
                .zip(&other.segments)
                .all(|(a, b)| Arc::ptr_eq(&a.bytes, &b.bytes))
    }

    pub fn head(&self, i: usize) -> Option<Head> {
        self.heads.get(i)
    }

    /// Id, time and tokens of every message, oldest first.
    pub fn heads(&self) -> impl DoubleEndedIterator<Item = Head> + ExactSizeIterator + '_ {
        self.heads.iter()
    }

    /// [`MessageLog::heads`] from index `from` on.
    pub fn heads_from(&self, from: usize) -> impl Iterator<Item = Head> + '_ {
        self.heads.range(from..self.heads.len())
    }

    /// A log of `messages` in order (loading an older format).
    pub fn from_messages(messages: Vec<super::Message>) -> Result<MessageLog, String> {
        let mut log = MessageLog::new();
        for m in messages {
            log.push(m.id, m.ts, m.tokens, &m.role, m.meta.as_deref(), &m.content)
                .map_err(|e| format!("corrupt payload: message {}: {e:?}", m.id))?;
        }
        log.settle();
        Ok(log)
    }

    pub fn get(&self, i: usize) -> Option<MessageRef<'_>> {
        Some(message(self.heads.get(i)?, self.data(i)))
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
        self.push_prepared(id, ts, tokens, role, meta, content, None)
    }

    /// [`push`](MessageLog::push), or, given the message's stored bytes
    /// built ahead ([`Prepared`]), those bytes: kept as the message's own
    /// segment when they would start one, so the main thread neither copies
    /// nor faults in a large message's bytes. The prepared bytes stand for
    /// role, meta and content (which a replica then need not copy into its
    /// op at all); the caller lays them out from the same texts.
    #[allow(clippy::too_many_arguments)]
    pub fn push_prepared(
        &mut self,
        id: u64,
        ts: i64,
        tokens: u64,
        role: &str,
        meta: Option<&str>,
        content: &str,
        prepared: Option<Prepared>,
    ) -> Result<(), LogError> {
        self.make_writable();
        let Some(Prepared(bytes)) = prepared else {
            let len = data_len(role, meta, content);
            self.reserve_position(len, tokens)?;
            // Never None: target makes the segment it returns.
            let target = self.target(len).ok_or(LogError::Full)?;
            encode_data(role, meta, content, target);
            self.finish_push(id, ts, tokens);
            return Ok(());
        };
        debug_assert!(
            content.is_empty() || {
                let mut expected = Vec::new();
                encode_data(role, meta, content, &mut expected);
                expected == bytes
            }
        );
        let len = bytes.len();
        self.reserve_position(len, tokens)?;
        if self.tail_takes(len) {
            self.target(len)
                .ok_or(LogError::Full)?
                .extend_from_slice(&bytes);
        } else {
            let start = self.end();
            if self.segments.is_empty() {
                self.segments.reserve_exact(1); // as `target` does
            }
            self.segments.push_back(Segment {
                start,
                bytes: Arc::new(bytes),
            });
        }
        self.finish_push(id, ts, tokens);
        Ok(())
    }

    /// Appends a message given as its stored bytes (a loaded RDB value),
    /// checked to be well formed.
    pub fn push_data(&mut self, id: u64, ts: i64, tokens: u64, data: &[u8]) -> Result<(), String> {
        self.make_writable();
        check_data(data)?;
        self.reserve_position(data.len(), tokens)
            .map_err(|e| format!("{e:?}"))?;
        self.target(data.len())
            .ok_or_else(|| format!("{:?}", LogError::Full))?
            .extend_from_slice(data);
        self.finish_push(id, ts, tokens);
        Ok(())
    }

    fn reserve_position(&mut self, len: usize, tokens: u64) -> Result<(), LogError> {
        if tokens > MAX_MESSAGE_TOKENS {
            return Err(LogError::Tokens);
        }
        if self.live_bytes().saturating_add(len) > MAX_LOG_BYTES {
            return Err(LogError::Full);
        }
        if self.span() + len > MAX_LOG_BYTES {
            self.compact_front(false);
            if self.span() + len > MAX_LOG_BYTES {
                return Err(LogError::Full);
            }
        }
        Ok(())
    }

    /// Where `len` new bytes go: the last segment while it stays within
    /// [`SEGMENT_BYTES`] or its capacity (copied first if shared), grown to
    /// the allocator's next class when it must grow; else a new segment.
    /// None only if no segment could be made (never).
    fn target(&mut self, len: usize) -> Option<&mut Vec<u8>> {
        let end = self.end();
        // Positions only increase: 0 until the first eviction (a loaded log
        // starts at 0 too).
        let evicts = self.first != 0;
        // A segment made for one large message takes smaller ones into the
        // room its size class left (a 60 KB tool result's class has 4 KB).
        // A log of one segment under SEGMENT_BYTES does not grow before the
        // write trims: the message goes to a second segment, which `settle`
        // moves into the room the trim left (a log at its caps keeps its
        // size) or into the first grown by a class.
        if !self.tail_takes(len) {
            if self.segments.is_empty() {
                // Most logs are one segment: room for one (4 by default).
                self.segments.reserve_exact(1);
            }
            self.segments
                .push_back(Segment::owned(end, size_class(len)));
        }
        let tail = Arc::make_mut(&mut self.segments.back_mut()?.bytes);
        let need = tail.len() + len;
        if need > tail.capacity() {
            // A log that evicts (it has since it was made or loaded: at its
            // caps, every append evicts) grows with room for one more
            // message like this one, within the segment's bound: half the
            // reallocations of an exact fit (each copies the segment: 16% of
            // a 600 B append at the caps), one message of spare room at
            // most. A log that only grows keeps the exact fit (its spare
            // room would stay: +2.6% at 600 B).
            let room = match need.saturating_add(len) {
                more if more <= SEGMENT_BYTES && evicts => more,
                _ => need,
            };
            tail.reserve_exact(size_class(room) - tail.len());
        }
        Some(tail)
    }

    /// Whether `len` new bytes go into the last segment ([`target`]).
    ///
    /// [`target`]: MessageLog::target
    fn tail_takes(&self, len: usize) -> bool {
        match (self.segments.len(), self.segments.back()) {
            (_, None) => false,
            (1, Some(only)) if only.bytes.capacity() - only.bytes.len() < len => false,
            (_, Some(tail)) => tail.bytes.len() + len <= SEGMENT_BYTES.max(tail.bytes.capacity()),
        }
    }

    /// Records the message whose bytes were just written (they end the last
    /// segment).
    fn finish_push(&mut self, id: u64, ts: i64, tokens: u64) {
        let end = self.segments.back().map_or(self.first, Segment::end);
        self.heads.push_back(Head {
            id,
            ts,
            end,
            tokens: tokens as u32,
        });
    }

    /// Removes the oldest message: its `(id, tokens)`.
    pub fn pop_front(&mut self) -> Option<(u64, u64)> {
        self.make_writable();
        let h = self.heads.get(0)?;
        self.drop_front(1);
        Some((h.id, u64::from(h.tokens)))
    }

    /// Removes the oldest `n` messages (all when fewer are held) at once:
    /// one pass over the segments, none over the messages (popped one by
    /// one, 100,000 messages evicted by a lowered cap held 3-5 ms; Redis's
    /// LTRIM of the same list 1 ms).
    pub fn drop_front(&mut self, n: usize) {
        self.make_writable();
        let n = n.min(self.heads.len());
        let Some(last) = n.checked_sub(1).and_then(|i| self.heads.get(i)) else {
            return;
        };
        self.heads.drop_front(n);
        self.first = last.end;
        if self.heads.is_empty() {
            self.segments.drain(..).for_each(discard);
        } else {
            // Segments every byte of which is evicted go at once.
            while self
                .segments
                .front()
                .is_some_and(|s| self.first.wrapping_sub(s.start) as usize >= s.bytes.len())
            {
                if let Some(gone) = self.segments.pop_front() {
                    discard(gone);
                }
            }
        }
    }

    /// Removes the newest message: its `(id, tokens)`.
    pub fn pop_back(&mut self) -> Option<(u64, u64)> {
        self.make_writable();
        let h = self.heads.pop_back()?;
        if self.heads.is_empty() {
            self.segments.clear();
            self.first = h.end;
        } else {
            let end = self.end();
            if let Some(tail) = self.segments.back_mut() {
                if tail.start == end {
                    self.segments.pop_back();
                } else {
                    // Copies a shared segment: only an import drops its
                    // newest message, on a session no copy shares.
                    Arc::make_mut(&mut tail.bytes).truncate(end.wrapping_sub(tail.start) as usize);
                }
            }
        }
        Some((h.id, u64::from(h.tokens)))
    }

    /// [`MessageLog::retain`] of the messages from index `from` on, those
    /// before it kept: the tail is cut and its kept messages written again,
    /// so the work is the tail's, not the log's (in a batch, each append
    /// may age out the message just before it: a rebuild of a
    /// 100,000-message log each time held the main thread 2-4 s).
    pub fn retain_from(&mut self, from: usize, mut keep: impl FnMut(&Head) -> bool) {
        if from == 0 {
            return self.retain(keep);
        }
        self.make_writable();
        let kept: Vec<(Head, Vec<u8>)> = (from..self.len())
            .filter_map(|i| {
                let h = self.heads.get(i)?;
                keep(&h).then(|| (h, self.data(i).to_vec()))
            })
            .collect();
        while self.len() > from {
            self.pop_back();
        }
        for (h, data) in kept {
            // The tail just cut held these bytes and tokens: they fit.
            if self
                .reserve_position(data.len(), u64::from(h.tokens))
                .is_ok()
            {
                if let Some(tail) = self.target(data.len()) {
                    tail.extend_from_slice(&data);
                    self.finish_push(h.id, h.ts, u64::from(h.tokens));
                }
            }
        }
    }

    /// Keeps the messages whose head `keep` accepts, in order. Dropping
    /// only the oldest ones (the usual age eviction) is a cursor move;
    /// anything else rebuilds only the segments that lose a message (an
    /// aged message just before the newest, in a 40 MB session, made the
    /// next write rebuild the whole buffer: 26-52 ms). Heads only: deciding
    /// reads no text (a decode checks its UTF-8).
    pub fn retain(&mut self, mut keep: impl FnMut(&Head) -> bool) {
        self.make_writable();
        let kept: Vec<bool> = self.heads.iter().map(|h| keep(&h)).collect();
        let dropped_prefix = kept.iter().take_while(|k| !**k).count();
        if kept.iter().skip(dropped_prefix).all(|k| *k) {
            self.drop_front(dropped_prefix);
            self.settle();
            return;
        }
        let mut heads = Heads::with_capacity(kept.iter().filter(|k| **k).count());
        let mut segments: VecDeque<Segment> = VecDeque::new();
        // Where the next kept byte goes; the segment being built, if any.
        let mut at = self.first;
        let mut building: Option<Segment> = None;
        // A built segment is sized to what it holds once it is done.
        let done = |mut built: Segment| {
            if let Some(bytes) = Arc::get_mut(&mut built.bytes) {
                bytes.shrink_to(size_class(bytes.len()));
            }
            built
        };
        let mut i = 0;
        for segment in &self.segments {
            // The messages whose bytes are in this segment: i..j.
            let mut j = i;
            while self
                .heads
                .get(j)
                .is_some_and(|h| h.end.wrapping_sub(segment.start) as usize <= segment.bytes.len())
            {
                j += 1;
            }
            if (i..j).all(|m| kept.get(m).copied().unwrap_or(false)) && j > i {
                // Kept whole: shared as it is, at its new position.
                segments.extend(building.take().map(done));
                let lead = self.begin(i).wrapping_sub(segment.start);
                let start = at.wrapping_sub(lead);
                for h in self.heads.range(i..j) {
                    heads.push_back(Head {
                        end: start.wrapping_add(h.end.wrapping_sub(segment.start)),
                        ..h
                    });
                }
                segments.push_back(Segment {
                    start,
                    bytes: Arc::clone(&segment.bytes),
                });
                at = start.wrapping_add(segment.bytes.len() as u32);
            } else {
                for m in (i..j).filter(|m| kept.get(*m).copied().unwrap_or(false)) {
                    let data = self.data(m);
                    let full = building
                        .as_ref()
                        .is_some_and(|b| b.bytes.len() + data.len() > SEGMENT_BYTES);
                    if full {
                        segments.extend(building.take().map(done));
                    }
                    let b = building
                        .get_or_insert_with(|| Segment::owned(at, data.len().max(SEGMENT_BYTES)));
                    Arc::make_mut(&mut b.bytes).extend_from_slice(data);
                    at = at.wrapping_add(data.len() as u32);
                    if let Some(h) = self.heads.get(m) {
                        heads.push_back(Head { end: at, ..h });
                    }
                }
            }
            i = j;
        }
        segments.extend(building.map(done));
        self.heads = heads;
        std::mem::replace(&mut self.segments, segments)
            .into_iter()
            .for_each(discard);
        if self.heads.is_empty() {
            self.segments.drain(..).for_each(discard);
        }
        self.settle();
    }

    /// Sets message `i`'s tokens (a re-count). Counts come from a count of
    /// the message's bytes, so they fit.
    pub fn set_tokens(&mut self, i: usize, tokens: u64) {
        self.heads
            .set_tokens(i, u32::try_from(tokens).unwrap_or(u32::MAX));
    }

    /// Drops the first segment's evicted bytes, moving what it keeps (less
    /// than what left, but for a log of one segment under SEGMENT_BYTES);
    /// `shrink` also gives back its spare capacity. A shared segment is
    /// left to its other holders: the log takes a copy of what it keeps.
    fn compact_front(&mut self, shrink: bool) {
        let first = self.first;
        let Some(segment) = self.segments.front_mut() else {
            return;
        };
        let dead = first.wrapping_sub(segment.start) as usize;
        // Kept bytes copied once, into an allocation of their class when
        // that is smaller (drain then shrink moved them twice: at a 600 B
        // session's caps the front's compaction was 12% of an append).
        let keep_len = segment.bytes.len().saturating_sub(dead);
        let smaller = shrink && size_class(keep_len) < segment.bytes.capacity();
        match Arc::get_mut(&mut segment.bytes) {
            Some(bytes) if smaller => *bytes = fitted(bytes.get(dead..).unwrap_or(&[])),
            Some(bytes) => {
                bytes.drain(..dead.min(bytes.len()));
            }
            None if dead > 0 => {
                segment.bytes = Arc::new(fitted(segment.bytes.get(dead..).unwrap_or(&[])));
            }
            None => {}
        }
        segment.start = first;
    }

    /// Tidies the log once a write is done (it has trimmed): gives back
    /// what evictions and summaries freed. Moves at most a segment's bytes.
    pub fn settle(&mut self) {
        self.make_writable();
        // Heads too: a summary of 100,000 messages down to 100 would keep
        // 3 MB of ring. Shrunk to twice what is held, so appends that
        // follow do not reallocate at once.
        if self.heads.capacity() > 64 && self.heads.capacity() > 4 * self.heads.len() {
            self.heads.shrink_to(2 * self.heads.len());
        }
        if self.segments.capacity() > 64 && self.segments.capacity() > 4 * self.segments.len() {
            self.segments.shrink_to(2 * self.segments.len());
        }
        if self.segments.len() == 2 && self.live_bytes() <= SEGMENT_BYTES {
            self.merge_second();
        }
        let dead = self.dead();
        let Some(front) = self.segments.front() else {
            return;
        };
        let (len, capacity) = (front.bytes.len(), front.bytes.capacity());
        let wasted = if self.segments.len() > 1 {
            // Moved once a third of it is evicted: at most two bytes moved
            // per byte evicted, at most a third of a segment spare. (A
            // quarter moved up to three, and at 600 B at the caps the
            // copies into fresh memory were most of what an append spent
            // over XADD; a third costs +0.4% of memory there, a half +3.7%.)
            3 * dead >= len
        } else {
            // The last segment takes appends into its spare room; more than
            // half of it spare is what a summary or an eviction freed.
            capacity > 4096 && capacity > 2 * size_class(len - dead)
        };
        if wasted {
            self.compact_front(true);
        }
    }

    /// Moves the second of two segments into the first, once the first's
    /// evicted bytes are dropped (at most SEGMENT_BYTES in all: the caller
    /// checks the live bytes fit).
    fn merge_second(&mut self) {
        self.compact_front(false);
        let Some(second) = self.segments.pop_back() else {
            return;
        };
        let Some(front) = self.segments.front_mut() else {
            self.segments.push_back(second);
            return;
        };
        let bytes = Arc::make_mut(&mut front.bytes);
        let need = bytes.len() + second.bytes.len();
        if need > bytes.capacity() {
            bytes.reserve_exact(size_class(need) - bytes.len());
        }
        bytes.extend_from_slice(&second.bytes);
    }

    /// A copy for another key (COPY): the segments shared, each key's
    /// writes copying what they change (at most a segment), as a worker's
    /// snapshot does; a copy of every byte held the main thread 71-201 ms
    /// for a 73 MB session. A view is laid out again (its own bytes only).
    /// MEMORY USAGE of each key counts what it can reach.
    pub fn copy_for_key(&self) -> MessageLog {
        if self.view_starts.is_none() {
            return self.clone();
        }
        let messages: Vec<(Head, &[u8])> = self.stored().collect();
        MessageLog::packed(self.first, &messages)
    }

    /// A log of `messages` (their heads' ends ignored: they are laid out
    /// again from `first`), in segments sized to what they hold.
    fn packed(first: u32, messages: &[(Head, &[u8])]) -> MessageLog {
        let mut log = MessageLog {
            heads: Heads::with_capacity(messages.len()),
            first,
            ..MessageLog::default()
        };
        let ends = messages.iter().scan(first, |at, (_, data)| {
            *at = at.wrapping_add(data.len() as u32);
            Some(*at)
        });
        let mut rest = messages;
        for_each_run(first, ends, |from, to, n| {
            let (group, after) = rest.split_at(n.min(rest.len()));
            let mut segment = Segment::owned(from, size_class(to.wrapping_sub(from) as usize));
            let buf = Arc::make_mut(&mut segment.bytes);
            let mut at = from;
            for (head, data) in group {
                buf.extend_from_slice(data);
                at = at.wrapping_add(data.len() as u32);
                log.heads.push_back(Head { end: at, ..*head });
            }
            log.segments.push_back(segment);
            rest = after;
        });
        log.segments.shrink_to_fit();
        log
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
        let arc = allocation(2 * std::mem::size_of::<usize>() + std::mem::size_of::<Vec<u8>>());
        allocation(self.heads.allocated())
            + allocation(self.segments.capacity() * std::mem::size_of::<Segment>())
            + self
                .segments
                .iter()
                .map(|s| arc + allocation(s.bytes.capacity()))
                .sum::<usize>()
    }

    /// Heads and stored bytes of every message in order (RDB, a load's
    /// check): a walk along the segments, not a search per message.
    pub fn stored(&self) -> impl Iterator<Item = (Head, &[u8])> + '_ {
        let (mut begin, mut k) = (self.first, 0usize);
        self.heads.iter().enumerate().map(move |(i, h)| {
            if self.view_starts.is_some() {
                return (h, self.data(i));
            }
            // Messages are in order: the one starting at `begin` is in
            // segment k or a later one.
            while let Some(s) = self.segments.get(k) {
                if (begin.wrapping_sub(s.start) as usize) < s.bytes.len() {
                    break;
                }
                k += 1;
            }
            let data = self.segments.get(k).map_or(&[][..], |s| {
                let at = begin.wrapping_sub(s.start) as usize;
                let len = h.end.wrapping_sub(begin) as usize;
                s.bytes.get(at..at.saturating_add(len)).unwrap_or(&[])
            });
            begin = h.end;
            (h, data)
        })
    }

    /// Each message's head and the bytes it takes as stored, from the heads
    /// alone: SAVE's walk, which reads the segments once, by
    /// [`stored_bytes`](MessageLog::stored_bytes). Finding each message in
    /// its segment ([`stored`](MessageLog::stored)) read the segment's
    /// header per message, and the stored length the ring's last head
    /// first: two cache misses a session on a walk over 100,000.
    pub fn stored_heads(&self) -> impl Iterator<Item = (Head, usize)> + '_ {
        let mut begin = self.first;
        self.heads.iter().enumerate().map(move |(i, h)| {
            if self.view_starts.is_some() {
                begin = self.begin(i);
            }
            let len = h.end.wrapping_sub(begin) as usize;
            begin = h.end;
            (h, len)
        })
    }

    /// Each message's head, and the message itself unless it is a common
    /// role and content alone (then its head says all a check of it needs).
    pub fn checkable(&self) -> impl Iterator<Item = (Head, Option<MessageRef<'_>>)> + '_ {
        self.stored().map(|(h, data)| {
            let plain = data
                .first()
                .is_some_and(|tag| tag & ROLE_MASK != ROLE_INLINE && tag & HAS_META == 0);
            (h, (!plain).then(|| message(h, data)))
        })
    }

    /// The stored bytes of every message in order, in pieces ([`stored_len`]
    /// in all): the segments, or each message of a view (whose segments
    /// hold what it left out).
    ///
    /// [`stored_len`]: MessageLog::stored_len
    pub fn stored_bytes(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let view = self.view_starts.is_some();
        let dead = self.dead();
        let segments = self
            .segments
            .iter()
            .enumerate()
            .filter(move |_| !view)
            .map(move |(k, s)| s.bytes.get(if k == 0 { dead } else { 0 }..).unwrap_or(&[]));
        let messages = (0..self.len())
            .filter(move |_| view)
            .map(move |i| self.data(i));
        segments.chain(messages)
    }

    /// A view about to be written becomes a log of its own (a copy of its
    /// messages' bytes): its positions are its source's, so written as a log
    /// it read other messages' bytes and saved what its heads did not say.
    fn make_writable(&mut self) {
        if self.view_starts.is_none() {
            return;
        }
        let fresh = {
            let messages: Vec<(Head, &[u8])> = self.stored().collect();
            MessageLog::packed(self.first, &messages)
        };
        *self = fresh;
    }

    /// A log from RDB format 3: heads as stored (each message's length in
    /// bytes instead of its position) and the concatenated bytes (tests:
    /// the decoder drives [`StoredLog`] itself).
    #[cfg(test)]
    pub fn from_stored(
        heads: impl ExactSizeIterator<Item = (u64, i64, u64, u64)>,
        bytes: &[u8],
    ) -> Result<MessageLog, String> {
        let mut log = StoredLog::with_capacity(heads.len());
        for (id, ts, tokens, len) in heads {
            log.head(id, ts, tokens, len)?;
        }
        log.finish(bytes)
    }
}

/// A log read from its stored form in one pass: each head as it is read
/// (its end is where the lengths so far reach), then the bytes, checked
/// message by message and copied into segments a run of messages at a
/// time. Loading 20,000 sessions of 30 x 200 B spent a fifth of its
/// module time on a vector of heads, another of messages, and a push of
/// each head with a write's checks.
pub struct StoredLog {
    heads: super::heads::Builder,
    end: u64,
}

impl StoredLog {
    pub fn with_capacity(n: usize) -> StoredLog {
        StoredLog {
            heads: super::heads::Builder::with_capacity(n),
            end: 0,
        }
    }

    /// The next message's head and the length of its stored bytes.
    pub fn head(&mut self, id: u64, ts: i64, tokens: u64, len: u64) -> Result<(), String> {
        if tokens > MAX_MESSAGE_TOKENS {
            return Err(format!("corrupt payload: message tokens {tokens}"));
        }
        self.end = self.end.saturating_add(len);
        if self.end > MAX_LOG_BYTES as u64 {
            return Err("corrupt payload: messages above 4 GiB".to_owned());
        }
        self.heads.push(Head {
            id,
            ts,
            end: self.end as u32,
            tokens: tokens as u32,
        });
        Ok(())
    }

    /// The log, given every message's bytes back to back.
    pub fn finish(self, bytes: &[u8]) -> Result<MessageLog, String> {
        let heads = self.checked(bytes)?;
        let mut segments = VecDeque::with_capacity(bytes.len().div_ceil(SEGMENT_BYTES).max(1));
        for_each_run(0, heads.iter().map(|h| h.end), |from, to, _| {
            // Within `bytes`: every head's range was checked against it.
            let run = bytes.get(from as usize..to as usize).unwrap_or_default();
            segments.push_back(Segment::copied(from, run));
        });
        segments.shrink_to_fit();
        Ok(MessageLog::loaded(heads, segments))
    }

    /// The heads, once `bytes` hold exactly their messages, each well formed.
    fn checked(self, bytes: &[u8]) -> Result<Heads, String> {
        if bytes.len() as u64 != self.end {
            return Err("corrupt payload: message bytes do not match their lengths".to_owned());
        }
        let heads = self.heads.finish();
        let mut at = 0u32;
        for h in heads.iter() {
            let data = bytes
                .get(at as usize..h.end as usize)
                .ok_or("corrupt payload: message bytes do not match their lengths")?;
            check_data(data)?;
            at = h.end;
        }
        Ok(heads)
    }
}

impl MessageLog {
    fn loaded(heads: Heads, segments: VecDeque<Segment>) -> MessageLog {
        MessageLog {
            heads,
            segments,
            first: 0,
            view_starts: None,
        }
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

/// Tells whether messages of one log are stored as messages of another,
/// asked in increasing order of both: at the same position of the same
/// shared segment (no byte read: a model switch asks it of every message,
/// and looking each one's segment up cost a cache miss each: 30 ms for
/// 100,000), else the bytes compared (a copy on write moved them).
pub struct SameBytes<'a> {
    a: &'a MessageLog,
    b: &'a MessageLog,
    at_a: usize,
    at_b: usize,
}

impl<'a> SameBytes<'a> {
    pub fn new(a: &'a MessageLog, b: &'a MessageLog) -> SameBytes<'a> {
        SameBytes {
            a,
            b,
            at_a: 0,
            at_b: 0,
        }
    }

    /// Whether message `i` of the first log is stored as message `j` of
    /// the second.
    pub fn check(&mut self, i: usize, j: usize) -> bool {
        let (Some(ha), Some(hb)) = (self.a.heads.get(i), self.b.heads.get(j)) else {
            return false;
        };
        let (from_a, from_b) = (self.a.begin(i), self.b.begin(j));
        let plain = self.a.view_starts.is_none() && self.b.view_starts.is_none();
        if plain && from_a == from_b && ha.end == hb.end {
            let sa = segment_at(&self.a.segments, &mut self.at_a, from_a);
            let sb = segment_at(&self.b.segments, &mut self.at_b, from_b);
            if let (Some(sa), Some(sb)) = (sa, sb) {
                if sa.start == sb.start && Arc::ptr_eq(&sa.bytes, &sb.bytes) {
                    return true;
                }
            }
        }
        self.a.data(i) == self.b.data(j)
    }
}

/// The segment holding position `at`, searched from `*from` on (asked in
/// increasing order).
fn segment_at<'s>(
    segments: &'s VecDeque<Segment>,
    from: &mut usize,
    at: u32,
) -> Option<&'s Segment> {
    while let Some(s) = segments.get(*from) {
        if (at.wrapping_sub(s.start) as usize) < s.bytes.len() {
            return Some(s);
        }
        *from += 1;
    }
    None
}

impl Iter<'_> {
    /// Bytes the messages left to iterate take as stored (from the heads).
    pub fn stored_len(&self) -> usize {
        (self.front..self.back)
            .map(|i| self.log.stored_len_of(i))
            .sum()
    }
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
