//! Unsigned LEB128 in its shortest form: the varints of the stored formats
//! (persistence/wire.rs) and the META length inside a message's stored bytes
//! (session/log.rs). Format 1's lenient postcard varints are read in
//! wire.rs alone.

/// Why [`take`] refused its input.
#[derive(Debug, PartialEq, Eq)]
pub enum Bad {
    /// The input ends inside the value.
    Truncated,
    /// Longer than the shortest form, or above 64 bits.
    NotCanonical,
}

/// Appends `v`.
pub fn push(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let low = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(low);
            return;
        }
        out.push(low | 0x80);
    }
}

/// The bytes [`push`] writes for `v`.
pub fn width(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// The value at the front of `bytes`, and what follows it.
#[inline]
pub fn take(bytes: &[u8]) -> Result<(u64, &[u8]), Bad> {
    // One or two bytes: most heads' fields (a load reads four a message;
    // a second apart is two).
    match bytes {
        [b, rest @ ..] if *b < 0x80 => Ok((u64::from(*b), rest)),
        [b0, b1, rest @ ..] if *b1 < 0x80 && *b1 != 0 => {
            Ok((u64::from(b0 & 0x7f) | u64::from(*b1) << 7, rest))
        }
        _ => take_long(bytes),
    }
}

fn take_long(bytes: &[u8]) -> Result<(u64, &[u8]), Bad> {
    let mut out = 0u64;
    for i in 0..10 {
        let &b = bytes.get(i).ok_or(Bad::Truncated)?;
        // The 10th byte holds bit 63 only.
        if i == 9 && b > 0x01 {
            break;
        }
        out |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                break; // a needless trailing zero group
            }
            return Ok((out, &bytes[i + 1..]));
        }
    }
    Err(Bad::NotCanonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_forms_round_trip_and_others_are_refused() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            1 << 35,
            1 << 63,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            push(&mut out, v);
            assert_eq!(out.len(), width(v), "{v}");
            out.push(0xaa);
            assert_eq!(take(&out), Ok((v, &[0xaa][..])), "{v}");
            assert_eq!(take(&out[..out.len() - 2]), Err(Bad::Truncated), "{v}");
        }
        assert_eq!(take(&[0x80, 0x00]), Err(Bad::NotCanonical));
        assert_eq!(
            take(&[0xff; 9].iter().chain(&[0x02]).copied().collect::<Vec<_>>()),
            Err(Bad::NotCanonical)
        );
        assert_eq!(take(&[0x80; 11]), Err(Bad::NotCanonical));
        assert_eq!(take(&[]), Err(Bad::Truncated));
    }
}
