//! Query strings: percent-decoding (`+` as a space), and the pairs of a
//! raw query. One place for what three routes need (metadata filters, E2B's
//! `metadata=` parameter, signed URLs).

/// `s` percent-decoded, `+` read as a space; `None` if a `%` escape is
/// malformed or the bytes are not UTF-8.
pub fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The decoded pairs of a query string (a key without `=` has an empty
/// value); `None` if any part does not decode.
pub fn pairs(raw: &str) -> Option<Vec<(String, String)>> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_escapes_and_plus() {
        assert_eq!(super::decode("a%20b+c%3D").as_deref(), Some("a b c="));
        assert_eq!(super::decode("%zz"), None);
        assert_eq!(super::decode("%2"), None);
        assert_eq!(
            super::pairs("a=1&b&c=%2F").unwrap(),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), String::new()),
                ("c".into(), "/".into())
            ]
        );
    }
}
