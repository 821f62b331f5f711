//! The byte-level pieces of the payload formats: unsigned LEB128 varints,
//! zigzag signed integers, length-prefixed byte strings and 0/1 tags.
//!
//! The reader never panics and never trusts a length beyond the input left,
//! so a corrupt length is an error, not a huge allocation. It follows the
//! rules of the format being read: format 1 is postcard's (lenient varints,
//! as postcard accepted them), format 2 and later are canonical (the
//! shortest varint only), so every accepted format-2 payload is exactly what
//! the encoder writes for the value it decodes to.

pub type Result<T> = std::result::Result<T, String>;

/// Format 1 and earlier read varints the way postcard did.
const FIRST_CANONICAL_FORMAT: u8 = 2;

pub struct Reader<'a> {
    rest: &'a [u8],
    format: u8,
}

impl<'a> Reader<'a> {
    /// A reader of `body`, the payload after its format byte `format`.
    pub fn new(body: &'a [u8], format: u8) -> Reader<'a> {
        Reader { rest: body, format }
    }

    /// The payload's format: a decoder shared by several versions reads the
    /// fields a version added only `if r.format() >= N`.
    pub fn format(&self) -> u8 {
        self.format
    }

    /// Succeeds only when every byte was read.
    pub fn finish(self) -> Result<()> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(format!("corrupt payload: {n} trailing bytes")),
        }
    }

    pub fn u8(&mut self, what: &str) -> Result<u8> {
        let (&b, rest) = self.rest.split_first().ok_or_else(|| truncated(what))?;
        self.rest = rest;
        Ok(b)
    }

    /// The next `len` bytes (`len` as read from the input: checked here).
    pub fn take(&mut self, len: u64, what: &str) -> Result<&'a [u8]> {
        let len = usize::try_from(len).map_err(|_| truncated(what))?;
        let (head, rest) = self
            .rest
            .split_at_checked(len)
            .ok_or_else(|| truncated(what))?;
        self.rest = rest;
        Ok(head)
    }

    /// An unsigned 64-bit varint, under the rules of the payload's format.
    #[inline]
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        if self.format >= FIRST_CANONICAL_FORMAT {
            self.leb128_canonical(what)
        } else {
            self.leb128_postcard(10, 0x01, what)
        }
    }

    /// A zigzag-encoded signed 64-bit integer (0, -1, 1, -2, ... as 0, 1, 2, 3, ...).
    pub fn i64(&mut self, what: &str) -> Result<i64> {
        let n = self.u64(what)?;
        Ok(((n >> 1) as i64) ^ -((n & 1) as i64))
    }

    /// A postcard enum variant index (a u32 varint). Format 1 only.
    pub fn postcard_variant(&mut self, what: &str) -> Result<u64> {
        self.leb128_postcard(5, 0x0f, what)
    }

    /// A count of elements that take at least `min_bytes` each: a count the
    /// rest of the input cannot hold is refused before anything is
    /// allocated, so `Vec::with_capacity(count)` is bounded by the input.
    pub fn count(&mut self, min_bytes: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        match usize::try_from(n) {
            Ok(n) if n <= self.rest.len() / min_bytes.max(1) => Ok(n),
            _ => Err(format!(
                "corrupt payload: {what} count {n} exceeds the payload"
            )),
        }
    }

    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, what: &str) -> Result<&'a str> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        crate::utf8::str(bytes).ok_or_else(|| format!("corrupt payload: {what} is not UTF-8"))
    }

    pub fn string(&mut self, what: &str) -> Result<String> {
        self.str(what).map(str::to_owned)
    }

    pub fn shared_str(&mut self, what: &str) -> Result<std::sync::Arc<str>> {
        self.str(what).map(std::sync::Arc::from)
    }

    pub fn boxed_str(&mut self, what: &str) -> Result<Box<str>> {
        self.str(what).map(Box::from)
    }

    /// A 0 (absent) or 1 (present) tag, then the value when present.
    pub fn option<T>(
        &mut self,
        what: &str,
        value: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<Option<T>> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => value(self).map(Some),
            tag => Err(format!("corrupt payload: {what} has option tag {tag}")),
        }
    }

    /// LEB128 as postcard reads it: at most `max_bytes` bytes, the last at
    /// most `last_max`; longer-than-needed forms are accepted (postcard did).
    fn leb128_postcard(&mut self, max_bytes: u32, last_max: u8, what: &str) -> Result<u64> {
        let mut out = 0u64;
        for i in 0..max_bytes {
            let b = self.u8(what)?;
            // i < 10, so the shift is below 64; high bits beyond u64 are
            // excluded by the last-byte check.
            out |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i + 1 == max_bytes && b > last_max {
                    break;
                }
                return Ok(out);
            }
        }
        Err(format!("corrupt payload: bad varint in {what}"))
    }

    /// LEB128 in its shortest form only, at most 64 bits.
    #[inline]
    fn leb128_canonical(&mut self, what: &str) -> Result<u64> {
        match crate::leb128::take(self.rest) {
            Ok((v, rest)) => {
                self.rest = rest;
                Ok(v)
            }
            Err(crate::leb128::Bad::Truncated) => Err(truncated(what)),
            Err(crate::leb128::Bad::NotCanonical) => {
                Err(format!("corrupt payload: bad varint in {what}"))
            }
        }
    }
}

fn truncated(what: &str) -> String {
    format!("corrupt payload: truncated in {what}")
}

/// The writer of format 2 and later (canonical varints).
pub struct Writer(Vec<u8>);

impl Writer {
    /// A payload that starts with its format byte, with room for `n` bytes
    /// (one allocation).
    pub fn with_capacity(format: u8, n: usize) -> Writer {
        Writer::reusing(Vec::new(), format, n)
    }

    /// [`with_capacity`](Writer::with_capacity) into `bytes`, emptied first
    /// (a buffer kept for the next payload).
    pub fn reusing(mut bytes: Vec<u8>, format: u8, n: usize) -> Writer {
        bytes.clear();
        bytes.reserve(n.max(1));
        bytes.push(format);
        Writer(bytes)
    }

    /// Room for `n` more bytes.
    pub fn reserve(&mut self, n: usize) {
        self.0.reserve(n);
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// Bytes written so far, the format byte included.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn u8(&mut self, b: u8) {
        self.0.push(b);
    }

    pub fn u64(&mut self, v: u64) {
        crate::leb128::push(&mut self.0, v);
    }

    pub fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    /// A length (an in-memory size: always fits 64 bits).
    pub fn length(&mut self, n: usize) {
        self.u64(n as u64);
    }

    pub fn str(&mut self, s: &str) {
        self.length(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }

    /// Bytes as they are (their length written before, by the caller).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    pub fn option<T: ?Sized>(&mut self, value: Option<&T>, write: impl FnOnce(&mut Self, &T)) {
        match value {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                write(self, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_u64(v: u64) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        w.u64(v);
        w.0
    }

    #[test]
    fn varints_round_trip_at_every_width() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            1 << 63,
            u64::MAX,
        ] {
            let bytes = write_u64(v);
            for format in [1, 2] {
                let mut r = Reader::new(&bytes, format);
                assert_eq!(r.u64("v").unwrap(), v, "{v} in format {format}");
                r.finish().unwrap();
            }
        }
        assert_eq!(write_u64(u64::MAX).len(), 10);
    }

    #[test]
    fn signed_values_round_trip() {
        for v in [0, -1, 1, -2, 1_700_000_000_000, i64::MIN, i64::MAX] {
            let mut w = Writer(Vec::new());
            w.i64(v);
            assert_eq!(Reader::new(&w.0, 2).i64("v").unwrap(), v);
        }
        let mut w = Writer(Vec::new());
        w.i64(-1);
        assert_eq!(w.0, [1]);
    }

    #[test]
    fn canonical_varints_only_from_format_2() {
        // 0 written in two bytes: postcard accepted it, format 2 does not.
        let overlong = [0x80, 0x00];
        assert_eq!(Reader::new(&overlong, 1).u64("v").unwrap(), 0);
        assert!(Reader::new(&overlong, 2).u64("v").is_err());
        // Beyond 64 bits: refused by both.
        let too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(Reader::new(&too_big, 1).u64("v").is_err());
        assert!(Reader::new(&too_big, 2).u64("v").is_err());
        // Eleven bytes: refused.
        let long = [0x80; 11];
        assert!(Reader::new(&long, 1).u64("v").is_err());
        assert!(Reader::new(&long, 2).u64("v").is_err());
        // A postcard variant index is a u32.
        assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x10], 1)
            .postcard_variant("v")
            .is_err());
        assert_eq!(
            Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x0f], 1)
                .postcard_variant("v")
                .unwrap(),
            u32::MAX as u64
        );
    }

    #[test]
    fn lengths_beyond_the_input_are_refused() {
        let mut r = Reader::new(&[0x05, b'a', b'b'], 2);
        assert!(r.str("s").unwrap_err().contains("truncated"));
        // A count of 2^62 elements in a 3-byte payload.
        let mut w = Writer(Vec::new());
        w.u64(1 << 62);
        w.0.extend_from_slice(b"abc");
        assert!(Reader::new(&w.0, 2)
            .count(1, "messages")
            .unwrap_err()
            .contains("exceeds"));
        assert_eq!(Reader::new(&[0x03, 1, 2, 3], 2).count(1, "x").unwrap(), 3);
        assert!(Reader::new(&[0x02, 1, 2, 3], 2).count(2, "x").is_err());
        assert!(Reader::new(&[0xc0, 0xff, 0xff], 2).u64("v").is_err());
    }

    #[test]
    fn options_take_tags_0_and_1_only() {
        assert_eq!(
            Reader::new(&[0], 2).option("o", |r| r.u8("x")).unwrap(),
            None
        );
        assert_eq!(
            Reader::new(&[1, 7], 2).option("o", |r| r.u8("x")).unwrap(),
            Some(7)
        );
        assert!(Reader::new(&[2, 7], 2).option("o", |r| r.u8("x")).is_err());
        assert!(Reader::new(&[1, 0xff], 2)
            .option("o", |r| r.str("x"))
            .is_err());
    }
}
