//! API keys: stored hashed, compared in constant time, and the owner a
//! request acts as.
//!
//! The key file holds one key per line, `NAME sha256:HEX`, where HEX is the
//! SHA-256 of the key a client sends (`Authorization: Bearer KEY` or
//! `X-API-Key: KEY`). The server never sees a key in the clear but in a
//! request, and never stores one. A key is 32 random bytes (256 bits), so
//! an unsalted hash is enough: there is no dictionary to try.

use std::path::Path;

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The owner of every sandbox when the server runs without keys (loopback
/// only).
pub const ANONYMOUS: &str = "anonymous";

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("cannot read the API key file {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `NAME sha256:HEX`.
    #[error("{path}:{line}: expected `NAME sha256:<64 hex digits>` ({reason})")]
    Syntax {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No key in the file.
    #[error("{path}: no keys")]
    Empty {
        /// The file.
        path: String,
    },
}

/// The keys the server accepts, by owner name.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    keys: Vec<(String, [u8; 32])>,
}

impl ApiKeys {
    /// Reads a key file (see the module docs). Names must be unique.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// Parses a key file's text; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Self, KeyFileError> {
        let mut keys: Vec<(String, [u8; 32])> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| KeyFileError::Syntax {
                path: path.into(),
                line: i + 1,
                reason: reason.into(),
            };
            let mut parts = line.split_whitespace();
            let (Some(name), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("two fields wanted"));
            };
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) || name.len() > 64 {
                return Err(bad("a name is 1-64 of [A-Za-z0-9-_.@]"));
            }
            let hex = hash
                .strip_prefix("sha256:")
                .ok_or_else(|| bad("the hash starts with sha256:"))?;
            let digest = decode_hex(hex).ok_or_else(|| bad("the hash is 64 hex digits"))?;
            if keys.iter().any(|(n, _)| n == name) {
                return Err(bad("the name is used twice"));
            }
            keys.push((name.to_string(), digest));
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty { path: path.into() });
        }
        Ok(Self { keys })
    }

    /// No key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The owner whose key this is. Every stored hash is compared, each in
    /// constant time, so neither the answer's time nor its path tells how
    /// much of a guess was right.
    pub fn owner_of(&self, presented: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (name, stored) in &self.keys {
            if bool::from(stored.ct_eq(&digest)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// A fresh key (`nz_` and 64 hex digits) and its key-file line for `name`.
pub fn new_key(name: &str) -> (String, String) {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    let key = format!("nz_{}", encode_hex(&raw));
    let line = format!("{name} sha256:{}", encode_hex(&Sha256::digest(key.as_bytes())));
    (key, line)
}

fn encode_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn decode_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_key_is_accepted_for_its_name_only() {
        let (alice, line_a) = new_key("alice");
        let (bob, line_b) = new_key("bob");
        let keys = ApiKeys::parse(&format!("# team\n{line_a}\n\n{line_b}\n"), "keys").unwrap_or_default();
        assert_eq!(keys.owner_of(&alice), Some("alice"));
        assert_eq!(keys.owner_of(&bob), Some("bob"));
        assert_eq!(keys.owner_of(&alice[..alice.len() - 1]), None);
        assert_eq!(keys.owner_of(""), None);
        assert!(!line_a.contains(&alice[3..]), "the line holds the hash, not the key");
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for (text, line) in [
            ("alice sha256:00", 1),
            (
                "\nalice 0000000000000000000000000000000000000000000000000000000000000000",
                2,
            ),
            ("alice", 1),
            ("a b c", 1),
        ] {
            match ApiKeys::parse(text, "k") {
                Err(KeyFileError::Syntax { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let (_, l) = new_key("a");
        assert!(matches!(
            ApiKeys::parse(&format!("{l}\n{l}"), "k"),
            Err(KeyFileError::Syntax { line: 2, .. })
        ));
        assert!(matches!(
            ApiKeys::parse("# none\n", "k"),
            Err(KeyFileError::Empty { .. })
        ));
    }
}
