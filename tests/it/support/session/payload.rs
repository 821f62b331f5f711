//! Payloads of the internal commands (`MEM._APPLY`), written here from the
//! layout in docs/FORMAT.md rather than by the module, so tests can craft
//! any value (also ones the commands would refuse). Format 2 is what the
//! module writes today; format 1 (release 0.1) must still be applied.

/// A payload being written: varints (LEB128), zigzag i64s, length-prefixed
/// strings, 0/1 option tags. The same primitives serve both formats.
pub struct Pc(pub Vec<u8>);

impl Pc {
    /// A payload of format 2.
    pub fn new() -> Pc {
        Pc(vec![2])
    }
    /// A payload of format 1.
    pub fn v1() -> Pc {
        Pc(vec![1])
    }
    pub fn u8(&mut self, b: u8) -> &mut Self {
        self.0.push(b);
        self
    }
    pub fn varint(&mut self, v: u64) -> &mut Self {
        crate::support::leb128::push(&mut self.0, v);
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.varint(((v << 1) ^ (v >> 63)) as u64)
    }
    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.varint(s.len() as u64);
        self.0.extend_from_slice(s);
        self
    }
    pub fn opt_str(&mut self, s: Option<&[u8]>) -> &mut Self {
        match s {
            None => self.u8(0),
            Some(s) => self.u8(1).str(s),
        }
    }
}

/// Stored encoding codes of format 2.
pub const O200K_BASE: u8 = 1;
pub const CL100K_BASE: u8 = 2;

/// Settings { model, encoding (a format-2 code), ttl, max_tokens, max_msgs,
/// max_age (format 2 only: appended at the end of its layout) }.
pub struct PSettings<'a> {
    pub model: &'a [u8],
    pub encoding: u8,
    pub ttl: u64,
    pub max_tokens: u64,
    pub max_msgs: u64,
    pub max_age: u64,
}

pub struct PMessage<'a> {
    pub id: u64,
    pub role: &'a [u8],
    pub content: &'a [u8],
    pub ts: i64,
    pub tokens: u64,
    pub meta: Option<&'a [u8]>,
}

// ---- format 2 ---------------------------------------------------------

pub fn put_settings(pc: &mut Pc, s: &PSettings) {
    pc.str(s.model)
        .u8(s.encoding)
        .varint(s.ttl)
        .varint(s.max_tokens)
        .varint(s.max_msgs)
        .varint(s.max_age);
}

/// A message: id, role, content, ts, tokens, meta (both formats).
pub fn put_message(pc: &mut Pc, m: &PMessage) {
    pc.varint(m.id)
        .str(m.role)
        .str(m.content)
        .i64(m.ts)
        .varint(m.tokens)
        .opt_str(m.meta);
}

/// Op kind 1, Append: now, settings, message, msgid (none here).
pub fn op_append(now: i64, s: &PSettings, m: &PMessage) -> Vec<u8> {
    let mut pc = Pc::new();
    pc.u8(1).i64(now);
    put_settings(&mut pc, s);
    put_message(&mut pc, m);
    pc.opt_str(None);
    pc.0
}

/// Op kind 2, Summarize: now, summary { text, tokens, upto, ts }.
pub fn op_summarize(now: i64, text: &[u8], tokens: u64, upto: u64, ts: i64) -> Vec<u8> {
    let mut pc = Pc::new();
    pc.u8(2)
        .i64(now)
        .str(text)
        .varint(tokens)
        .varint(upto)
        .i64(ts);
    pc.0
}

/// Op kind 3, ExtSet: now, settings, system, external { id, expires_at }.
pub fn op_extset(now: i64, s: &PSettings, system: &[u8], id: &[u8], expires_at: i64) -> Vec<u8> {
    let mut pc = Pc::new();
    pc.u8(3).i64(now);
    put_settings(&mut pc, s);
    pc.str(system).str(id).i64(expires_at);
    pc.0
}

pub fn default_psettings() -> PSettings<'static> {
    PSettings {
        model: b"gpt-4o",
        encoding: O200K_BASE,
        ttl: 0,
        max_tokens: 80_000,
        max_msgs: 30,
        max_age: 0,
    }
}

// ---- format 1 (release 0.1: postcard of its structs) ----------------------

/// Settings of format 1: the encoding is postcard's variant index (0 o200k,
/// 1 cl100k), as a varint.
fn put_settings_v1(pc: &mut Pc, s: &PSettings) {
    let variant = match s.encoding {
        O200K_BASE => 0,
        CL100K_BASE => 1,
        other => panic!("no format-1 variant for encoding code {other}"),
    };
    pc.str(s.model)
        .varint(variant)
        .varint(s.ttl)
        .varint(s.max_tokens)
        .varint(s.max_msgs);
}

/// `Op::Append` in format 1 (variant 0): now, settings, message.
pub fn op_append_v1(now: i64, s: &PSettings, m: &PMessage) -> Vec<u8> {
    let mut pc = Pc::v1();
    pc.varint(0).i64(now);
    put_settings_v1(&mut pc, s);
    put_message(&mut pc, m);
    pc.0
}

/// `Op::Summarize` in format 1 (variant 1).
pub fn op_summarize_v1(now: i64, text: &[u8], tokens: u64, upto: u64, ts: i64) -> Vec<u8> {
    let mut pc = Pc::v1();
    pc.varint(1)
        .i64(now)
        .str(text)
        .varint(tokens)
        .varint(upto)
        .i64(ts);
    pc.0
}

/// `Op::ExtSet` in format 1 (variant 2).
pub fn op_extset_v1(now: i64, s: &PSettings, system: &[u8], id: &[u8], expires_at: i64) -> Vec<u8> {
    let mut pc = Pc::v1();
    pc.varint(2).i64(now);
    put_settings_v1(&mut pc, s);
    pc.str(system).str(id).i64(expires_at);
    pc.0
}
