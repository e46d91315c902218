//! Kubernetes' URL CEL library (`url()`, `isURL()`, `getHost()`, ...), on a port of Go's
//! `net/url` parser (Go 1.26 defaults, `urlstrictcolons` on) so that accepted inputs, the
//! accessors' results and the error texts match kube-scheduler.
//!
//! Go strings are byte strings: percent-decoding may produce invalid UTF-8, so parsing works on
//! bytes and results are converted (lossily) only when they become CEL strings.
use super::semver::go_quote;

/// A parsed URL, as Go's `url.URL` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Url {
    scheme: Vec<u8>,
    opaque: Vec<u8>,
    user: Option<UserInfo>,
    host: Vec<u8>,
    path: Vec<u8>,
    raw_path: Vec<u8>,
    fragment: Vec<u8>,
    raw_fragment: Vec<u8>,
    raw_query: Vec<u8>,
    force_query: bool,
    omit_host: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct UserInfo {
    username: Vec<u8>,
    password: Option<Vec<u8>>,
}

/// Go's `encoding` modes of `shouldEscape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
    QueryComponent,
    Fragment,
}

fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    // Hosts keep the sub-delims, `:` and `[]` (ports, IPv6) and `<>"` (rejected later anyway).
    if matches!(mode, Mode::Host | Mode::Zone)
        && (is_sub_delim(c) || matches!(c, b':' | b'[' | b']' | b'<' | b'>' | b'"'))
    {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => return false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => return c == b'?',
            Mode::UserPassword => return matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::QueryComponent => return true,
            Mode::Fragment => return false,
            Mode::Host | Mode::Zone => {}
        },
        _ => {}
    }
    if mode == Mode::Fragment && matches!(c, b'!' | b'(' | b')' | b'*') {
        return false;
    }
    true
}

/// RFC 3986 sub-delims.
fn is_sub_delim(c: u8) -> bool {
    matches!(
        c,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

/// Go's `strconv.Quote` of a byte string: invalid UTF-8 bytes print as `\xNN`.
fn quote_bytes(b: &[u8]) -> String {
    let mut out = String::from("\"");
    for chunk in b.utf8_chunks() {
        let q = go_quote(chunk.valid());
        out.push_str(&q[1..q.len() - 1]);
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out.push('"');
    out
}

fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, String> {
    let escape_error = |at: &[u8]| format!("invalid URL escape {}", quote_bytes(at));
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                if i + 2 >= s.len()
                    || !s[i + 1].is_ascii_hexdigit()
                    || !s[i + 2].is_ascii_hexdigit()
                {
                    let rest = &s[i..];
                    return Err(escape_error(&rest[..rest.len().min(3)]));
                }
                let esc = &s[i..i + 3];
                // Hosts may only escape non-ASCII bytes (RFC 6874 zones aside).
                if mode == Mode::Host && unhex(s[i + 1]) < 8 && esc != b"%25" {
                    return Err(escape_error(esc));
                }
                if mode == Mode::Zone {
                    let v = unhex(s[i + 1]) << 4 | unhex(s[i + 2]);
                    if esc != b"%25" && v != b' ' && should_escape(v, Mode::Host) {
                        return Err(escape_error(esc));
                    }
                }
                i += 3;
            }
            c => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                    return Err(format!(
                        "invalid character {} in host name",
                        quote_bytes(&[c])
                    ));
                }
                i += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                out.push(unhex(s[i + 1]) << 4 | unhex(s[i + 2]));
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

fn escape(s: &[u8], mode: Mode) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len());
    for &c in s {
        if c == b' ' && mode == Mode::QueryComponent {
            out.push(b'+');
        } else if should_escape(c, mode) {
            out.extend_from_slice(&[b'%', HEX[usize::from(c >> 4)], HEX[usize::from(c & 15)]]);
        } else {
            out.push(c);
        }
    }
    out
}

fn valid_encoded(s: &[u8], mode: Mode) -> bool {
    s.iter().all(|&c| {
        is_sub_delim(c) || matches!(c, b':' | b'@' | b'[' | b']' | b'%') || !should_escape(c, mode)
    })
}

fn valid_optional_port(port: &[u8]) -> bool {
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

fn find(s: &[u8], b: u8) -> Option<usize> {
    s.iter().position(|&c| c == b)
}

fn rfind(s: &[u8], b: u8) -> Option<usize> {
    s.iter().rposition(|&c| c == b)
}

fn find_sub(s: &[u8], sub: &[u8]) -> Option<usize> {
    s.windows(sub.len()).position(|w| w == sub)
}

/// Go's `getScheme`: the scheme and the rest, or "missing protocol scheme".
fn split_scheme(raw: &[u8]) -> Result<(&[u8], &[u8]), String> {
    for (i, &c) in raw.iter().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok((b"", raw)),
        }
    }
    Ok((b"", raw))
}

fn parse_host(scheme: &[u8], host: &[u8]) -> Result<Vec<u8>, String> {
    let invalid_port = |p: &[u8]| format!("invalid port {} after host", quote_bytes(p));
    match rfind(host, b'[') {
        Some(open) if open > 0 => return Err("invalid IP-literal".into()),
        Some(_) => {
            let Some(close) = rfind(host, b']') else {
                return Err("missing ']' in host".into());
            };
            let colon_port = &host[close + 1..];
            if !valid_optional_port(colon_port) {
                return Err(invalid_port(colon_port));
            }
            let colon_port = unescape(colon_port, Mode::Host)?;
            let hostname = &host[1..close];
            let mut unescaped = match find_sub(hostname, b"%25") {
                Some(zone) => {
                    let mut h = unescape(&hostname[..zone], Mode::Host)?;
                    h.extend(unescape(&hostname[zone..], Mode::Zone)?);
                    h
                }
                None => unescape(hostname, Mode::Host)?,
            };
            let text = String::from_utf8_lossy(&unescaped).into_owned();
            match super::net::parse_addr(&text) {
                Err(e) => return Err(format!("invalid host: {e}")),
                Ok(super::net::Addr::V4(_)) => return Err("invalid IP-literal".into()),
                Ok(_) => {}
            }
            let mut out = b"[".to_vec();
            out.append(&mut unescaped);
            out.push(b']');
            out.extend(colon_port);
            return Ok(out);
        }
        None => {}
    }
    if let Some(first) = find(host, b':') {
        let mut i = first;
        // Go 1.26 (`urlstrictcolons` default): http(s) hosts must not contain extra colons.
        if scheme != b"http" && scheme != b"https" {
            i = rfind(host, b':').unwrap_or(first);
        }
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return Err(invalid_port(colon_port));
        }
    }
    unescape(host, Mode::Host)
}

fn parse_authority(scheme: &[u8], authority: &[u8]) -> Result<(Option<UserInfo>, Vec<u8>), String> {
    let at = rfind(authority, b'@');
    let host = parse_host(scheme, &authority[at.map_or(0, |i| i + 1)..])?;
    let Some(at) = at else {
        return Ok((None, host));
    };
    let userinfo = &authority[..at];
    let valid = String::from_utf8_lossy(userinfo).chars().all(|r| {
        r.is_ascii_alphanumeric()
            || u8::try_from(r).is_ok_and(|c| {
                is_sub_delim(c) || matches!(c, b'-' | b'.' | b'_' | b':' | b'~' | b'%' | b'@')
            })
    });
    if !valid {
        return Err("net/url: invalid userinfo".into());
    }
    let user = match find(userinfo, b':') {
        None => UserInfo {
            username: unescape(userinfo, Mode::UserPassword)?,
            password: None,
        },
        Some(c) => UserInfo {
            username: unescape(&userinfo[..c], Mode::UserPassword)?,
            password: Some(unescape(&userinfo[c + 1..], Mode::UserPassword)?),
        },
    };
    Ok((Some(user), host))
}

/// Go's unexported `parse(rawURL, viaRequest)`.
fn parse(raw: &[u8], via_request: bool) -> Result<Url, String> {
    if raw.iter().any(|&b| b < b' ' || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let mut url = Url::default();
    if raw == b"*" {
        url.path = b"*".to_vec();
        return Ok(url);
    }
    let (scheme, mut rest) = split_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.last() == Some(&b'?') && rest.iter().filter(|&&c| c == b'?').count() == 1 {
        url.force_query = true;
        rest = &rest[..rest.len() - 1];
    } else if let Some(q) = find(rest, b'?') {
        url.raw_query = rest[q + 1..].to_vec();
        rest = &rest[..q];
    }
    if !rest.starts_with(b"/") {
        if !url.scheme.is_empty() {
            url.opaque = rest.to_vec();
            return Ok(url);
        }
        if via_request {
            return Err("invalid URI for request".into());
        }
        let segment = &rest[..find(rest, b'/').unwrap_or(rest.len())];
        if segment.contains(&b':') {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with(b"///"))
        && rest.starts_with(b"//")
    {
        let mut authority = &rest[2..];
        rest = b"";
        if let Some(i) = find(authority, b'/') {
            (authority, rest) = (&authority[..i], &authority[i..]);
        }
        let (user, host) = parse_authority(&url.scheme, authority)?;
        (url.user, url.host) = (user, host);
    } else if !url.scheme.is_empty() && rest.starts_with(b"/") {
        url.omit_host = true;
    }
    url.path = unescape(rest, Mode::Path)?;
    url.raw_path = if escape(&url.path, Mode::Path) == rest {
        Vec::new()
    } else {
        rest.to_vec()
    };
    Ok(url)
}

fn parse_error(raw: &[u8], err: String) -> String {
    format!("parse {}: {err}", quote_bytes(raw))
}

/// Go's `url.Parse`.
fn go_parse(raw: &str) -> Result<Url, String> {
    let raw = raw.as_bytes();
    let (u, frag) = match find(raw, b'#') {
        Some(i) => (&raw[..i], &raw[i + 1..]),
        None => (raw, &b""[..]),
    };
    let mut url = parse(u, false).map_err(|e| parse_error(u, e))?;
    if !frag.is_empty() {
        url.fragment = unescape(frag, Mode::Fragment).map_err(|e| parse_error(raw, e))?;
        url.raw_fragment = if escape(&url.fragment, Mode::Fragment) == frag {
            Vec::new()
        } else {
            frag.to_vec()
        };
    }
    Ok(url)
}

/// Go's `url.ParseRequestURI`.
fn go_parse_request_uri(raw: &str) -> Result<Url, String> {
    parse(raw.as_bytes(), true).map_err(|e| parse_error(raw.as_bytes(), e))
}

/// `isURL(s)`.
pub fn is_url(raw: &str) -> bool {
    go_parse_request_uri(raw).is_ok()
}

/// `url(s)`: the string must be a request URI, and is then parsed as a URL reference.
pub fn k8s_url(raw: &str) -> Result<Url, String> {
    const CTX: &str = "URL parse error during conversion from string";
    go_parse_request_uri(raw).map_err(|e| format!("{CTX}: {e}"))?;
    go_parse(raw).map_err(|e| format!("{CTX}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl Url {
    pub fn scheme(&self) -> String {
        text(&self.scheme)
    }

    pub fn host(&self) -> String {
        text(&self.host)
    }

    /// Go's `splitHostPort`, used by `Hostname()` and `Port()`.
    fn split_host_port(&self) -> (&[u8], &[u8]) {
        let mut host = &self.host[..];
        let mut port: &[u8] = b"";
        if let Some(colon) = rfind(host, b':')
            && valid_optional_port(&host[colon..])
        {
            (host, port) = (&host[..colon], &host[colon + 1..]);
        }
        if host.len() >= 2 && host.starts_with(b"[") && host.ends_with(b"]") {
            host = &host[1..host.len() - 1];
        }
        (host, port)
    }

    pub fn hostname(&self) -> String {
        text(self.split_host_port().0)
    }

    pub fn port(&self) -> String {
        text(self.split_host_port().1)
    }

    fn escaped_path_bytes(&self) -> Vec<u8> {
        if !self.raw_path.is_empty()
            && valid_encoded(&self.raw_path, Mode::Path)
            && unescape(&self.raw_path, Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == b"*" {
            return self.path.clone();
        }
        escape(&self.path, Mode::Path)
    }

    pub fn escaped_path(&self) -> String {
        text(&self.escaped_path_bytes())
    }

    /// Go's `URL.Query()`: malformed pairs are dropped; keys keep first-seen order.
    pub fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        // Go gives up on queries with more than 10,000 parameters (an empty map).
        if self.raw_query.iter().filter(|&&c| c == b'&').count() + 1 > 10_000 {
            return out;
        }
        for pair in self.raw_query.split(|&c| c == b'&') {
            if pair.is_empty() || pair.contains(&b';') {
                continue;
            }
            let (k, v) = match find(pair, b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &b""[..]),
            };
            let (Ok(k), Ok(v)) = (
                unescape(k, Mode::QueryComponent),
                unescape(v, Mode::QueryComponent),
            ) else {
                continue;
            };
            let (k, v) = (text(&k), text(&v));
            match out.iter_mut().find(|(key, _)| *key == k) {
                Some((_, values)) => values.push(v),
                None => out.push((k, vec![v])),
            }
        }
        out
    }

    fn escaped_fragment(&self) -> Vec<u8> {
        if !self.raw_fragment.is_empty()
            && valid_encoded(&self.raw_fragment, Mode::Fragment)
            && unescape(&self.raw_fragment, Mode::Fragment).is_ok_and(|f| f == self.fragment)
        {
            return self.raw_fragment.clone();
        }
        escape(&self.fragment, Mode::Fragment)
    }

    /// Go's `URL.String()`, which defines URL equality in Kubernetes' CEL library.
    pub fn to_go_string(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        if !self.scheme.is_empty() {
            buf.extend_from_slice(&self.scheme);
            buf.push(b':');
        }
        if !self.opaque.is_empty() {
            buf.extend_from_slice(&self.opaque);
        } else {
            let has_authority =
                !self.scheme.is_empty() || !self.host.is_empty() || self.user.is_some();
            if has_authority && !(self.omit_host && self.host.is_empty() && self.user.is_none()) {
                if !self.host.is_empty() || !self.path.is_empty() || self.user.is_some() {
                    buf.extend_from_slice(b"//");
                }
                if let Some(user) = &self.user {
                    buf.extend(escape(&user.username, Mode::UserPassword));
                    if let Some(p) = &user.password {
                        buf.push(b':');
                        buf.extend(escape(p, Mode::UserPassword));
                    }
                    buf.push(b'@');
                }
                buf.extend(escape(&self.host, Mode::Host));
            }
            let path = self.escaped_path_bytes();
            if !path.is_empty() && path[0] != b'/' && !self.host.is_empty() {
                buf.push(b'/');
            }
            if buf.is_empty() {
                let segment = &path[..find(&path, b'/').unwrap_or(path.len())];
                if segment.contains(&b':') {
                    buf.extend_from_slice(b"./");
                }
            }
            buf.extend(path);
        }
        if self.force_query || !self.raw_query.is_empty() {
            buf.push(b'?');
            buf.extend_from_slice(&self.raw_query);
        }
        if !self.fragment.is_empty() {
            buf.push(b'#');
            buf.extend(self.escaped_fragment());
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_go() {
        let u = k8s_url("https://user:pw@[::1%25eth0]:8443/a%2Fb?x=1&x=2#f").unwrap();
        assert_eq!(u.hostname(), "::1%eth0");
        assert_eq!(u.port(), "8443");
        assert_eq!(u.escaped_path(), "/a%2Fb");
        assert_eq!(u.query(), vec![("x".into(), vec!["1".into(), "2".into()])]);
        assert!(!is_url("example.com"));
        assert_eq!(
            k8s_url("http://a:b:c/").unwrap_err(),
            "URL parse error during conversion from string: parse \"http://a:b:c/\": invalid port \":b:c\" after host"
        );
    }
}
