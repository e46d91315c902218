//! Kubernetes' IP and CIDR CEL libraries (`ip()`, `cidr()`, ...), on a port of Go's `net/netip`
//! parser so that accepted inputs, canonical strings and error texts match kube-scheduler.
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// An IP address as Go's `netip.Addr` holds it (the zone only matters for rejecting it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    V4([u8; 4]),
    V6([u8; 16], Option<String>),
}

/// A prefix as `netip.Prefix`: the address is kept unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    pub addr: Addr,
    pub bits: u8,
}

pub(crate) use super::semver::go_quote;

fn addr_error(input: &str, msg: &str, at: Option<&str>) -> String {
    match at {
        Some(at) if !at.is_empty() => format!(
            "ParseAddr({}): {msg} (at {})",
            go_quote(input),
            go_quote(at)
        ),
        _ => format!("ParseAddr({}): {msg}", go_quote(input)),
    }
}

/// `netip.ParseAddr`.
pub fn parse_addr(s: &str) -> Result<Addr, String> {
    for b in s.bytes() {
        match b {
            b'.' => return parse_v4(s).map(Addr::V4),
            b':' => return parse_v6(s),
            b'%' => return Err(addr_error(s, "missing IPv6 address", None)),
            _ => {}
        }
    }
    Err(addr_error(s, "unable to parse IP", None))
}

fn parse_v4_fields(input: &str, off: usize, end: usize, out: &mut [u8]) -> Result<(), String> {
    let s = &input.as_bytes()[off..end];
    let (mut val, mut pos, mut dig_len) = (0u32, 0usize, 0usize);
    for i in 0..s.len() {
        let c = s[i];
        if c.is_ascii_digit() {
            if dig_len == 1 && val == 0 {
                return Err(addr_error(
                    input,
                    "IPv4 field has octet with leading zero",
                    None,
                ));
            }
            val = val * 10 + u32::from(c - b'0');
            dig_len += 1;
            if val > 255 {
                return Err(addr_error(input, "IPv4 field has value >255", None));
            }
        } else if c == b'.' {
            let rest = &input[off + i..end];
            if i == 0 || i == s.len() - 1 || s[i - 1] == b'.' {
                return Err(addr_error(
                    input,
                    "IPv4 field must have at least one digit",
                    Some(rest),
                ));
            }
            if pos == 3 {
                return Err(addr_error(input, "IPv4 address too long", None));
            }
            out[pos] = val as u8;
            pos += 1;
            val = 0;
            dig_len = 0;
        } else {
            // Slicing at a non-ASCII byte could split a character; take the rest from there.
            let rest = input.get(off + i..end).unwrap_or("");
            return Err(addr_error(input, "unexpected character", Some(rest)));
        }
    }
    if pos < 3 {
        return Err(addr_error(input, "IPv4 address too short", None));
    }
    out[3] = val as u8;
    Ok(())
}

fn parse_v4(s: &str) -> Result<[u8; 4], String> {
    let mut fields = [0u8; 4];
    parse_v4_fields(s, 0, s.len(), &mut fields)?;
    Ok(fields)
}

fn parse_v6(input: &str) -> Result<Addr, String> {
    let (mut s, zone) = match input.find('%') {
        Some(i) => {
            let zone = &input[i + 1..];
            if zone.is_empty() {
                return Err(addr_error(input, "zone must be a non-empty string", None));
            }
            (&input[..i], Some(zone.to_string()))
        }
        None => (input, None),
    };
    let mut ip = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    if s.len() >= 2 && s.starts_with("::") {
        ellipsis = Some(0);
        s = &s[2..];
        if s.is_empty() {
            return Ok(Addr::V6(ip, zone));
        }
    }
    let mut i = 0usize;
    while i < 16 {
        let bytes = s.as_bytes();
        let mut off = 0usize;
        let mut acc = 0u32;
        while off < bytes.len() {
            let c = bytes[off];
            let digit = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => break,
            };
            acc = (acc << 4) + u32::from(digit);
            if off > 3 {
                return Err(addr_error(
                    input,
                    "each group must have 4 or less digits",
                    Some(s),
                ));
            }
            if acc > 0xffff {
                return Err(addr_error(input, "IPv6 field has value >=2^16", Some(s)));
            }
            off += 1;
        }
        if off == 0 {
            return Err(addr_error(
                input,
                "each colon-separated field must have at least one digit",
                Some(s),
            ));
        }
        if off < bytes.len() && bytes[off] == b'.' {
            if ellipsis.is_none() && i != 12 {
                return Err(addr_error(
                    input,
                    "embedded IPv4 address must replace the final 2 fields of the address",
                    Some(s),
                ));
            }
            if i + 4 > 16 {
                return Err(addr_error(
                    input,
                    "too many hex fields to fit an embedded IPv4 at the end of the address",
                    Some(s),
                ));
            }
            let end = input.len() - zone.as_ref().map(|z| z.len() + 1).unwrap_or(0);
            parse_v4_fields(input, end - s.len(), end, &mut ip[i..i + 4])?;
            s = "";
            i += 4;
            break;
        }
        ip[i] = (acc >> 8) as u8;
        ip[i + 1] = acc as u8;
        i += 2;
        s = &s[off..];
        if s.is_empty() {
            break;
        }
        if !s.starts_with(':') {
            return Err(addr_error(
                input,
                "unexpected character, want colon",
                Some(s),
            ));
        } else if s.len() == 1 {
            return Err(addr_error(
                input,
                "colon must be followed by more characters",
                Some(s),
            ));
        }
        s = &s[1..];
        if s.starts_with(':') {
            if ellipsis.is_some() {
                return Err(addr_error(input, "multiple :: in address", Some(s)));
            }
            ellipsis = Some(i);
            s = &s[1..];
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return Err(addr_error(input, "trailing garbage after address", Some(s)));
    }
    if i < 16 {
        let Some(e) = ellipsis else {
            return Err(addr_error(input, "address string too short", None));
        };
        let n = 16 - i;
        for j in (e..i).rev() {
            ip[j + n] = ip[j];
        }
        for b in &mut ip[e..e + n] {
            *b = 0;
        }
    } else if ellipsis.is_some() {
        return Err(addr_error(
            input,
            "the :: must expand to at least one field of zeros",
            None,
        ));
    }
    Ok(Addr::V6(ip, zone))
}

impl Addr {
    fn is_4in6(&self) -> bool {
        matches!(self, Addr::V6(b, _) if b[..10].iter().all(|x| *x == 0) && b[10] == 0xff && b[11] == 0xff)
    }

    /// Family view used by the predicates: IPv4-mapped addresses count as IPv4, like Go's Unmap.
    fn unmapped(&self) -> Addr {
        match self {
            Addr::V6(b, _) if self.is_4in6() => Addr::V4([b[12], b[13], b[14], b[15]]),
            other => other.clone(),
        }
    }

    pub fn family(&self) -> i64 {
        match self {
            Addr::V4(_) => 4,
            Addr::V6(..) => 6,
        }
    }

    pub fn is_unspecified(&self) -> bool {
        match self {
            Addr::V4(b) => *b == [0; 4],
            Addr::V6(b, z) => *b == [0; 16] && z.is_none(),
        }
    }

    pub fn is_loopback(&self) -> bool {
        match self.unmapped() {
            Addr::V4(b) => b[0] == 127,
            Addr::V6(b, _) => b[..15].iter().all(|x| *x == 0) && b[15] == 1,
        }
    }

    fn is_multicast(&self) -> bool {
        match self.unmapped() {
            Addr::V4(b) => b[0] & 0xf0 == 0xe0,
            Addr::V6(b, _) => b[0] == 0xff,
        }
    }

    pub fn is_link_local_multicast(&self) -> bool {
        match self.unmapped() {
            Addr::V4(b) => b[0] == 224 && b[1] == 0 && b[2] == 0,
            Addr::V6(b, _) => (u16::from(b[0]) << 8 | u16::from(b[1])) & 0xff0f == 0xff02,
        }
    }

    pub fn is_link_local_unicast(&self) -> bool {
        match self.unmapped() {
            Addr::V4(b) => b[0] == 169 && b[1] == 254,
            Addr::V6(b, _) => (u16::from(b[0]) << 8 | u16::from(b[1])) & 0xffc0 == 0xfe80,
        }
    }

    pub fn is_global_unicast(&self) -> bool {
        let ip = self.unmapped();
        if let Addr::V4(b) = ip
            && (b == [0; 4] || b == [255; 4])
        {
            return false;
        }
        let unspecified6 = matches!(&ip, Addr::V6(b, None) if *b == [0; 16]);
        !unspecified6 && !ip.is_loopback() && !ip.is_multicast() && !ip.is_link_local_unicast()
    }

    fn bit_len(&self) -> u8 {
        match self {
            Addr::V4(_) => 32,
            Addr::V6(..) => 128,
        }
    }

    fn as_u128(&self) -> u128 {
        match self {
            Addr::V4(b) => u128::from(u32::from_be_bytes(*b)),
            Addr::V6(b, _) => u128::from_be_bytes(*b),
        }
    }

    /// The address with all but the top `bits` bits cleared (zone dropped, as Go does).
    fn masked(&self, bits: u8) -> Addr {
        let len = self.bit_len();
        let keep = if bits >= len {
            !0u128
        } else if bits == 0 {
            0
        } else {
            (!0u128) << (len - bits)
        };
        let full = if len == 32 { u128::from(u32::MAX) } else { !0 };
        let v = self.as_u128() & keep & full;
        match self {
            Addr::V4(_) => Addr::V4((v as u32).to_be_bytes()),
            Addr::V6(..) => Addr::V6(v.to_be_bytes(), None),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Rust and Go both print RFC 5952 form (longest zero run compressed, `::ffff:a.b.c.d`).
        match self {
            Addr::V4(b) => write!(f, "{}", Ipv4Addr::from(*b)),
            Addr::V6(b, zone) => {
                write!(f, "{}", Ipv6Addr::from(*b))?;
                if let Some(z) = zone {
                    write!(f, "%{z}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// `netip.ParsePrefix`.
pub fn parse_prefix(s: &str) -> Result<Prefix, String> {
    let err = |msg: &str| format!("netip.ParsePrefix({}): {msg}", go_quote(s));
    let Some(i) = s.rfind('/') else {
        return Err(err("no '/'"));
    };
    let addr = parse_addr(&s[..i]).map_err(|e| err(&e))?;
    if matches!(addr, Addr::V6(_, Some(_))) {
        return Err(err("IPv6 zones cannot be present in a prefix"));
    }
    let bits_str = &s[i + 1..];
    let bad = || err(&format!("bad bits after slash: {}", go_quote(bits_str)));
    let first = bits_str.as_bytes().first().copied();
    if bits_str.len() > 1 && !matches!(first, Some(b'1'..=b'9')) {
        return Err(bad());
    }
    // Go's Atoi: optional sign, decimal digits, range-checked to int64.
    let digits = bits_str.strip_prefix(['+', '-']).unwrap_or(bits_str);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let bits: i64 = bits_str.parse().map_err(|_| bad())?;
    if bits < 0 || bits > i64::from(addr.bit_len()) {
        return Err(err("prefix length out of range"));
    }
    Ok(Prefix {
        addr,
        bits: bits as u8,
    })
}

/// Kubernetes `parseIPAddr`: Go's parser plus the zone and IPv4-mapped rejections.
pub fn k8s_ip(raw: &str) -> Result<Addr, String> {
    let addr = parse_addr(raw).map_err(|e| {
        format!(
            "IP Address {} parse error during conversion from string: {e}",
            go_quote(raw)
        )
    })?;
    if matches!(addr, Addr::V6(_, Some(_))) {
        return Err(format!(
            "IP address {} with zone value is not allowed",
            go_quote(raw)
        ));
    }
    if addr.is_4in6() {
        return Err(format!(
            "IPv4-mapped IPv6 address {} is not allowed",
            go_quote(raw)
        ));
    }
    Ok(addr)
}

/// Kubernetes `cidr()`: the library wraps `parseCIDR`'s error in the same prefix once more.
pub fn k8s_cidr(raw: &str) -> Result<Prefix, String> {
    const CTX: &str = "network address parse error during conversion from string";
    let prefix = parse_prefix(raw).map_err(|e| format!("{CTX}: {CTX}: {e}"))?;
    if prefix.addr.is_4in6() {
        return Err(format!(
            "{CTX}: IPv4-mapped IPv6 address {} is not allowed",
            go_quote(raw)
        ));
    }
    Ok(prefix)
}

impl Prefix {
    pub fn contains(&self, ip: &Addr) -> bool {
        if matches!(ip, Addr::V6(_, Some(_))) || self.addr.bit_len() != ip.bit_len() {
            return false;
        }
        ip.masked(self.bits) == self.addr.masked(self.bits)
    }

    pub fn overlaps(&self, o: &Prefix) -> bool {
        if self == o {
            return true;
        }
        if self.addr.bit_len() != o.addr.bit_len() {
            return false;
        }
        let min = self.bits.min(o.bits);
        min == 0 || self.addr.masked(min) == o.addr.masked(min)
    }

    pub fn contains_prefix(&self, o: &Prefix) -> bool {
        self.overlaps(o) && self.bits <= o.bits
    }

    pub fn masked(&self) -> Prefix {
        Prefix {
            addr: self.addr.masked(self.bits),
            bits: self.bits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_parse_errors() {
        assert_eq!(
            k8s_ip("127.0.0.1.0").unwrap_err(),
            "IP Address \"127.0.0.1.0\" parse error during conversion from string: ParseAddr(\"127.0.0.1.0\"): IPv4 address too long"
        );
        assert_eq!(
            k8s_ip("2001:db8:::68").unwrap_err(),
            "IP Address \"2001:db8:::68\" parse error during conversion from string: ParseAddr(\"2001:db8:::68\"): each colon-separated field must have at least one digit (at \":68\")"
        );
        assert_eq!(
            k8s_ip("2001:DB8::68").map(|a| a.to_string()),
            Ok("2001:db8::68".into())
        );
    }

    #[test]
    fn prefixes() {
        let p = parse_prefix("192.168.0.1/24").unwrap();
        assert_eq!(p.masked().to_string(), "192.168.0.0/24");
        assert!(p.contains(&parse_addr("192.168.0.77").unwrap()));
        let q = parse_prefix("2001:db8::/32").unwrap();
        assert!(q.contains_prefix(&parse_prefix("2001:db8::/33").unwrap()));
        assert!(!q.contains_prefix(&parse_prefix("2001:db8::/31").unwrap()));
    }
}
