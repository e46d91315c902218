//! Reads glibc's `/etc/ld.so.cache`: the library folders a driver root's dynamic linker knows,
//! which is where the NVIDIA container toolkit looks for the driver's libraries first.
//!
//! Format (glibc `dl-cache.h`): optionally the old `ld.so-1.7.0` table, then (8-byte aligned) the
//! new `glibc-ld.so.cache1.1` header: nlibs, string table length, flags, extension offset, then
//! 24-byte entries `{flags: i32, key: u32, value: u32, osversion: u32, hwcap: u64}` whose string
//! offsets count from the new header.
use std::path::{Path, PathBuf};

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;

/// `FLAG_ELF_LIBC6`: the library type of every glibc-era entry.
const FLAG_ELF_LIBC6: i32 = 0x0003;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_REQUIRED_MASK: i32 = 0xff00;
/// 64-bit ABIs (`FLAG_X8664_LIB64`, `FLAG_AARCH64_LIB64`): 32-bit libraries are never mounted.
const FLAGS_64BIT: [i32; 2] = [0x0300, 0x0a00];

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct LdCacheError {
    pub path: PathBuf,
    pub reason: String,
}

/// One library the cache lists: its name (usually the soname) and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedLibrary {
    pub name: String,
    pub path: PathBuf,
}

/// The 64-bit libraries an ld cache lists.
pub fn read(path: &Path) -> Result<Vec<CachedLibrary>, LdCacheError> {
    let bytes = std::fs::read(path).map_err(|e| LdCacheError {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    parse(&bytes).map_err(|reason| LdCacheError {
        path: path.to_path_buf(),
        reason,
    })
}

pub fn parse(bytes: &[u8]) -> Result<Vec<CachedLibrary>, String> {
    let start = if bytes.starts_with(NEW_MAGIC) {
        0
    } else if bytes.starts_with(OLD_MAGIC) {
        let old_count = u32_at(bytes, 12)? as usize;
        let end = OLD_HEADER + old_count * OLD_ENTRY;
        // The new table follows, aligned as its 8-byte entries need.
        end.div_ceil(8) * 8
    } else {
        return Err("not a glibc ld.so.cache".into());
    };
    if !bytes.get(start..).is_some_and(|b| b.starts_with(NEW_MAGIC)) {
        return Err(
            "no glibc-ld.so.cache1.1 table (only the old format, which glibc dropped)".into(),
        );
    }
    let count = u32_at(bytes, start + 20)? as usize;
    let mut libraries = Vec::new();
    for index in 0..count {
        let entry = start + NEW_HEADER + index * NEW_ENTRY;
        let flags = u32_at(bytes, entry)? as i32;
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6
            || !FLAGS_64BIT.contains(&(flags & FLAG_REQUIRED_MASK))
        {
            continue;
        }
        let name = string_at(bytes, start + u32_at(bytes, entry + 4)? as usize)?;
        let path = string_at(bytes, start + u32_at(bytes, entry + 8)? as usize)?;
        libraries.push(CachedLibrary {
            name,
            path: PathBuf::from(path),
        });
    }
    Ok(libraries)
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| format!("truncated at byte {at}"))
}

fn string_at(bytes: &[u8], at: usize) -> Result<String, String> {
    let tail = bytes
        .get(at..)
        .ok_or_else(|| format!("string offset {at} is past the end"))?;
    let end = tail
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| format!("unterminated string at byte {at}"))?;
    String::from_utf8(tail[..end].to_vec()).map_err(|_| format!("string at byte {at} is not UTF-8"))
}

/// Writes a new-format cache listing `libraries` (64-bit x86 entries): what `ldconfig` would
/// write for them. Tests use it to build fake driver roots.
pub fn write(libraries: &[CachedLibrary]) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut offsets = Vec::new();
    let table_start = NEW_HEADER + libraries.len() * NEW_ENTRY;
    for library in libraries {
        let name = table_start + strings.len();
        strings.extend_from_slice(library.name.as_bytes());
        strings.push(0);
        let path = table_start + strings.len();
        strings.extend_from_slice(library.path.to_string_lossy().as_bytes());
        strings.push(0);
        offsets.push((name as u32, path as u32));
    }
    let mut out = Vec::with_capacity(table_start + strings.len());
    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(&(libraries.len() as u32).to_le_bytes());
    out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // flags, padding
    out.extend_from_slice(&[0u8; 4]); // extension offset: none
    out.extend_from_slice(&[0u8; 12]); // unused
    for (name, path) in offsets {
        out.extend_from_slice(&(FLAG_ELF_LIBC6 | FLAGS_64BIT[0]).to_le_bytes());
        out.extend_from_slice(&name.to_le_bytes());
        out.extend_from_slice(&path.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
    }
    out.extend_from_slice(&strings);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hosts_own_cache() {
        // Every glibc system has one, and it lists the C library.
        let libraries = read(Path::new("/etc/ld.so.cache")).expect("the host's ld.so.cache");
        assert!(
            libraries
                .iter()
                .any(|l| l.name == "libc.so.6" && l.path.to_string_lossy().ends_with("/libc.so.6")),
            "{libraries:?}"
        );
    }

    #[test]
    fn round_trips_what_it_writes_and_rejects_garbage() {
        let libraries = vec![
            CachedLibrary {
                name: "libcuda.so.1".into(),
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            },
            CachedLibrary {
                name: "libnvidia-ml.so.1".into(),
                path: "/usr/lib64/libnvidia-ml.so.1".into(),
            },
        ];
        assert_eq!(parse(&write(&libraries)).expect("parse"), libraries);
        assert!(parse(b"not a cache").is_err());
        let mut truncated = write(&libraries);
        truncated.truncate(60);
        assert!(parse(&truncated).is_err());
    }
}
