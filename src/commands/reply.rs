//! Writes replies straight to the client, in the order the spec lists the
//! fields (the crate's map types would reorder them). A map is a RESP3 map,
//! or a flat field/value array under RESP2, as Redis does for XINFO.

use redis_module::{raw, Context};

pub struct Reply<'a> {
    ctx: &'a Context,
}

impl<'a> Reply<'a> {
    pub fn new(ctx: &'a Context) -> Reply<'a> {
        Reply { ctx }
    }

    pub fn map(&self, fields: usize) -> &Self {
        raw::reply_with_map(self.ctx.ctx, fields as _);
        self
    }

    pub fn array(&self, len: usize) -> &Self {
        raw::reply_with_array(self.ctx.ctx, len as _);
        self
    }

    pub fn bulk(&self, s: &str) -> &Self {
        raw::reply_with_string_buffer(self.ctx.ctx, s.as_ptr().cast(), s.len());
        self
    }

    /// Every u64 replied is bounded far below i64::MAX (ids by MAX_ID,
    /// caps and TTLs by validation, token counts by the bytes counted), so
    /// the conversion never saturates; it only keeps this panic-free.
    pub fn int(&self, n: u64) -> &Self {
        raw::reply_with_long_long(self.ctx.ctx, i64::try_from(n).unwrap_or(i64::MAX));
        self
    }

    pub fn signed(&self, n: i64) -> &Self {
        raw::reply_with_long_long(self.ctx.ctx, n);
        self
    }

    /// A map field with an integer value.
    pub fn field_int(&self, name: &str, n: u64) -> &Self {
        self.bulk(name).int(n)
    }

    pub fn field_str(&self, name: &str, s: &str) -> &Self {
        self.bulk(name).bulk(s)
    }
}
