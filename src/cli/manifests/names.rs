//! Generated names and UIDs, derived from the inputs where the API server picks at random, so
//! the same manifests always give the same names.
/// The characters the API server's name generator appends (`names.SimpleNameGenerator`).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `n` name characters derived from `seed` (the API server picks them at random).
pub(super) fn name_chars(seed: &str, n: usize) -> String {
    let mut out = String::with_capacity(n);
    let mut round = 0u32;
    while out.len() < n {
        let id = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{seed}#{round}").as_bytes(),
        );
        for b in id.as_bytes() {
            if out.len() == n {
                break;
            }
            out.push(char::from(
                NAME_ALPHABET[usize::from(*b) % NAME_ALPHABET.len()],
            ));
        }
        round += 1;
    }
    out
}

/// `generateName` as the API server completes it: the base cut to 58 bytes, 5 characters added.
pub(super) fn generated_name(base: &str, seed: &str) -> String {
    format!("{}{}", truncate(base, 58), name_chars(seed, 5))
}

pub(super) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(super) fn uid(seed: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).to_string()
}
