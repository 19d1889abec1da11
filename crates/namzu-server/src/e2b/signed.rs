//! Signed `/files` URLs (the SDK's `download_url` / `upload_url`): the
//! URL names no sandbox, only a signature
//! `v1_<base64 unpadded sha256("path:op:user:token[:expiration]")>` made
//! with one sandbox's envd token. The sandbox is the one whose token
//! reproduces it (each compared in constant time); an expired or unmatched
//! signature is 401.

use axum::http::{Method, StatusCode};
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::control::E2bError;
use crate::registry::{now_ms, Record};
use crate::state::AppState;

/// The signature of `path` for `op` by `user` with `token`.
pub fn sign(path: &str, op: &str, user: &str, token: &str, expiration: Option<u64>) -> String {
    let raw = match expiration {
        Some(e) => format!("{path}:{op}:{user}:{token}:{e}"),
        None => format!("{path}:{op}:{user}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k == name).then(|| crate::urlenc::decode(v)).flatten()
    })
}

/// The sandbox a signed `/files` request is for.
pub fn target(st: &AppState, method: &Method, query: &str) -> Result<Record, E2bError> {
    let refuse = |m: &str| E2bError(StatusCode::UNAUTHORIZED, m.into());
    let op = match *method {
        Method::GET => "read",
        Method::POST => "write",
        _ => {
            return Err(E2bError(
                StatusCode::METHOD_NOT_ALLOWED,
                "signed URLs are for GET and POST".into(),
            ))
        }
    };
    let path = param(query, "path").unwrap_or_default();
    let user = param(query, "username").unwrap_or_default();
    let signature = param(query, "signature").unwrap_or_default();
    let expiration = match param(query, "signature_expiration") {
        None => None,
        Some(e) => Some(e.parse::<u64>().map_err(|_| refuse("bad signature_expiration"))?),
    };
    if expiration.is_some_and(|e| e * 1000 < now_ms()) {
        return Err(refuse("the signed URL has expired"));
    }
    let mut found = None;
    for r in st.registry.all() {
        if let Some(token) = &r.envd_token {
            let want = sign(&path, op, &user, token, expiration);
            if bool::from(want.as_bytes().ct_eq(signature.as_bytes())) {
                found = Some(r);
            }
        }
    }
    found.ok_or_else(|| refuse("the signature matches no sandbox"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SDK's own algorithm (`e2b/sandbox/signature.py`), its value
    /// computed with Python's hashlib and base64.
    #[test]
    fn signatures_match_the_sdk() {
        assert_eq!(
            sign("/workspace/a.txt", "read", "", "tok", None),
            "v1_r4cRI0zRJwxs4olZpziwp+uW7tDLursuYdoeeT3+d1U"
        );
        assert_ne!(
            sign("/a", "read", "", "tok", Some(1)),
            sign("/a", "read", "", "tok", Some(2))
        );
        assert_eq!(param("path=%2Fa%20b&x=1", "path").as_deref(), Some("/a b"));
    }
}
