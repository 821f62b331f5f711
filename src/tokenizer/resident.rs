//! Gives back the pages of the module's file that an encoding's build read
//! once. The module carries o200k_base's counting tables serialized (14.6
//! MB; 32 MB when they were bpe-openai's whole ones) and builds heap tables
//! from them; the serialized pages stayed in the server's RSS (32.4 MB of
//! its 84 MB then) though nothing reads them again.
//!
//! Only read-only private mappings of the module's own file with no
//! anonymous page are touched: every page there is the file's, unchanged,
//! so dropping it loses nothing and a later read faults the same bytes back
//! in from the page cache (the tables a count reads come back that way, at
//! a minor fault per 4 KiB). Linux only; elsewhere nothing is done.
//!
//! /proc/self/smaps is read by hand: a few fields of one file, where a
//! crate for all of procfs would be a dependency for four lines.

/// Drops the module file's clean read-only pages from this process's RSS;
/// the bytes that were resident.
#[cfg(target_os = "linux")]
pub fn release_file_pages() -> u64 {
    let Some(base) = module_base() else {
        return 0;
    };
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mappings = parse(&smaps);
    let Some(file) = mappings
        .iter()
        .find(|m| m.start <= base && base < m.end)
        .map(|m| m.file)
    else {
        return 0;
    };
    let mut released = 0;
    for m in mappings.iter().filter(|m| {
        m.file == file && m.file.1 != 0 && m.perms == "r--p" && m.anonymous_kb == 0 && m.rss_kb > 0
    }) {
        // SAFETY: [start, end) is a whole mapping of this process (from its
        // smaps), private, read-only and without anonymous pages: each of
        // its pages is the module file's, unchanged, so MADV_DONTNEED only
        // unmaps pages a later read faults back in with the same bytes.
        let done = unsafe {
            libc::madvise(
                m.start as *mut libc::c_void,
                m.end - m.start,
                libc::MADV_DONTNEED,
            )
        };
        if done == 0 {
            released += m.rss_kb * 1024;
        }
    }
    released
}

#[cfg(not(target_os = "linux"))]
pub fn release_file_pages() -> u64 {
    0
}

/// Where the module is loaded (the dynamic linker's base of this object).
#[cfg(target_os = "linux")]
fn module_base() -> Option<usize> {
    static HERE: u8 = 0;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and writes `info`, a valid,
    // zeroed Dl_info; it returns 0 (and we return None) if it found nothing.
    let found = unsafe { libc::dladdr(std::ptr::addr_of!(HERE).cast(), info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so it filled `info`.
    let info = unsafe { info.assume_init() };
    Some(info.dli_fbase as usize)
}

#[derive(Debug, PartialEq, Eq)]
struct Mapping<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    /// (device, inode); inode 0 for anonymous mappings.
    file: (&'a str, u64),
    rss_kb: u64,
    anonymous_kb: u64,
}

/// The mappings of an smaps text (a line `start-end perms offset dev inode
/// [path]`, then `Field: value kB` lines).
fn parse(smaps: &str) -> Vec<Mapping<'_>> {
    let mut out: Vec<Mapping<'_>> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_ascii_whitespace();
        let (Some(first), Some(second)) = (words.next(), words.next()) else {
            continue;
        };
        if let Some(field) = first.strip_suffix(':') {
            let kb = second.parse().unwrap_or(0);
            if let Some(m) = out.last_mut() {
                match field {
                    "Rss" => m.rss_kb = kb,
                    "Anonymous" => m.anonymous_kb = kb,
                    _ => {}
                }
            }
            continue;
        }
        let Some((start, end)) = first.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        let _offset = words.next();
        let (Some(dev), Some(inode)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(Mapping {
            start,
            end,
            perms: second,
            file: (dev, inode.parse().unwrap_or(0)),
            rss_kb: 0,
            anonymous_kb: 0,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_mappings_and_their_fields() {
        let text = "\
7fda15c00000-7fda19f33000 r--p 00000000 fe:00 5308864                    /x/libredis_mem.so
Size:              70860 kB
Rss:               32384 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
7fda1a215000-7fda1a261000 r--p 04613000 fe:00 5308864                    /x/libredis_mem.so
Rss:                 304 kB
Anonymous:           304 kB
7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]
Rss:                   8 kB
";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].start, m[0].end), (0x7fda15c00000, 0x7fda19f33000));
        assert_eq!((m[0].perms, m[0].file), ("r--p", ("fe:00", 5308864)));
        assert_eq!((m[0].rss_kb, m[0].anonymous_kb), (32384, 0));
        assert_eq!((m[1].rss_kb, m[1].anonymous_kb), (304, 304));
        assert_eq!(m[2].file, ("00:00", 0));
    }

    #[test]
    fn a_release_keeps_every_byte_readable() {
        // In the test binary the "module" is the test executable itself.
        static TABLE: [u8; 1 << 16] = {
            let mut t = [0u8; 1 << 16];
            let mut i = 0;
            while i < t.len() {
                t[i] = (i % 251) as u8;
                i += 1;
            }
            t
        };
        let before: u64 = TABLE.iter().map(|&b| u64::from(b)).sum();
        release_file_pages();
        let after: u64 = std::hint::black_box(&TABLE)
            .iter()
            .map(|&b| u64::from(b))
            .sum();
        assert_eq!(before, after);
    }
}
