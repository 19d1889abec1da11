//! Registry credentials: what docker's config holds for a registry, and the
//! exchange of an identity token for an access token.
//!
//! Promises:
//! * credentials are read as docker reads them (`$DOCKER_CONFIG/config.json`
//!   or `~/.docker/config.json`: `auths`, `credHelpers`, `credsStore`);
//!   none configured is an anonymous pull, an unreadable config or a helper
//!   that fails is [`Error::RegistryAuthRefused`](crate::Error::RegistryAuthRefused);
//! * an identity token (what `docker login` keeps for registries that hand
//!   out OAuth2 refresh tokens, and what a credential helper answers with
//!   the user `<token>`) is never sent to the registry itself: it is
//!   exchanged at the realm the registry's challenge names
//!   (`grant_type=refresh_token`, scoped to pulling this repository) for an
//!   access token, which the pull then carries. A realm that refuses it is
//!   `RegistryAuthRefused`; a registry that does not challenge for a bearer
//!   token is pulled from anonymously;
//! * every answer read here is bounded ([`MAX_AUTH_RESPONSE`]).

use std::path::{Path, PathBuf};

use oci_client::secrets::RegistryAuth;
use reqwest::header::WWW_AUTHENTICATE;

use super::PullOptions;

/// The most of a challenge or token answer read before it is refused.
pub const MAX_AUTH_RESPONSE: usize = 64 * 1024;

/// What docker's config holds for one registry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Credential {
    /// Nothing: pull anonymously.
    Anonymous,
    /// A user name and password (or a token used as one).
    Basic(String, String),
    /// An OAuth2 refresh token, to be exchanged at the registry's realm.
    Identity(String),
}

/// The credentials docker's config holds for `registry`.
pub(crate) fn from_docker_config(config_dir: Option<&Path>, registry: &str) -> std::result::Result<Credential, String> {
    use docker_credential::{CredentialRetrievalError as C, DockerCredential};
    let dir = config_dir.map(Path::to_path_buf).or_else(|| {
        std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
    });
    let Some(Ok(f)) = dir.map(|d| std::fs::File::open(d.join("config.json"))) else {
        return Ok(Credential::Anonymous);
    };
    // Docker Hub's credentials are filed under its v1 address.
    let server = match registry {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => "https://index.docker.io/v1/",
        other => other,
    };
    match docker_credential::get_credential_from_reader(std::io::BufReader::new(f), server) {
        Ok(DockerCredential::UsernamePassword(u, p)) => Ok(Credential::Basic(u, p)),
        Ok(DockerCredential::IdentityToken(t)) => Ok(Credential::Identity(t)),
        Err(C::NoCredentialConfigured) => Ok(Credential::Anonymous),
        Err(C::ConfigReadError) => Err("docker config.json is not valid JSON".into()),
        Err(e) => Err(format!("docker credentials for {registry}: {e}")),
    }
}

/// Why an identity token could not be exchanged; the pull names the image
/// and registry when it turns this into its [`Error`](crate::Error).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExchangeFailure {
    /// The realm refused the token (401 / 403).
    Refused(String),
    /// The registry or its realm could not be reached.
    Unreachable(String),
    /// An answer that is not what the token protocol says.
    Protocol(String),
}

/// An error with its causes, for humans.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The realm and service of a registry's `Bearer` challenge.
fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    http_auth::ChallengeParser::new(header)
        .filter_map(|c| c.ok())
        .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        .and_then(|c| {
            let param = |name: &str| {
                c.params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            Some((param("realm")?, param("service")))
        })
}

/// Reads at most [`MAX_AUTH_RESPONSE`] bytes of `res`'s body.
async fn bounded_body(mut res: reqwest::Response) -> std::result::Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_AUTH_RESPONSE {
            return Err(format!("answer longer than {MAX_AUTH_RESPONSE} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Exchanges the identity token `refresh` for an access token to pull
/// `repository` from `base` (`scheme://registry`).
pub(crate) async fn exchange_identity_token(
    opts: &PullOptions,
    base: &str,
    repository: &str,
    refresh: &str,
) -> Result<RegistryAuth, ExchangeFailure> {
    use ExchangeFailure as F;
    let http = reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .read_timeout(opts.read_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| F::Protocol(format!("HTTP client: {e}")))?;
    let unreachable = |e: reqwest::Error| F::Unreachable(chain(&e));
    let res = http.get(format!("{base}/v2/")).send().await.map_err(unreachable)?;
    let challenge = res
        .headers()
        .get(WWW_AUTHENTICATE)
        .and_then(|h| h.to_str().ok())
        .and_then(bearer_challenge);
    let Some((realm, service)) = challenge else {
        // No token service to exchange it at: the registry serves pulls
        // without one (a `Basic` challenge cannot take a refresh token).
        return Ok(RegistryAuth::Anonymous);
    };
    let scope = format!("repository:{repository}:pull");
    let mut form = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", refresh),
        ("client_id", "namzu"),
        ("scope", scope.as_str()),
    ];
    if let Some(s) = &service {
        form.push(("service", s));
    }
    let res = http.post(&realm).form(&form).send().await.map_err(unreachable)?;
    let status = res.status();
    let body = bounded_body(res)
        .await
        .map_err(|e| F::Protocol(format!("token service {realm}: {e}")))?;
    if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
        let reason = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
        return Err(F::Refused(format!(
            "identity token refused by {realm} ({status}): {reason}"
        )));
    }
    if !status.is_success() {
        return Err(F::Protocol(format!("token service {realm} answered {status}")));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: Option<String>,
        token: Option<String>,
    }
    let answer: Answer = serde_json::from_slice(&body)
        .map_err(|e| F::Protocol(format!("token service {realm}: not a token answer: {e}")))?;
    answer
        .access_token
        .or(answer.token)
        .filter(|t| !t.is_empty())
        .map(RegistryAuth::Bearer)
        .ok_or_else(|| F::Protocol(format!("token service {realm}: answer has no access_token")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_give_realm_and_service() {
        let h = r#"Basic realm="x", Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a:pull""#;
        assert_eq!(
            bearer_challenge(h),
            Some(("https://auth.example/token".into(), Some("registry.example".into())))
        );
        assert_eq!(bearer_challenge(r#"Basic realm="registry""#), None);
        assert_eq!(bearer_challenge(r#"Bearer service="no-realm""#), None);
    }

    #[test]
    fn docker_config_identity_tokens_are_told_apart() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"auths":{"r.example":{"identitytoken":"refresh-me"},"b.example":{"auth":"dTpw"}}}"#,
        )
        .unwrap();
        assert_eq!(
            from_docker_config(Some(d.path()), "r.example"),
            Ok(Credential::Identity("refresh-me".into()))
        );
        assert_eq!(
            from_docker_config(Some(d.path()), "b.example"),
            Ok(Credential::Basic("u".into(), "p".into()))
        );
        assert_eq!(
            from_docker_config(Some(d.path()), "other.example"),
            Ok(Credential::Anonymous)
        );
        std::fs::write(d.path().join("config.json"), "{not json").unwrap();
        assert!(from_docker_config(Some(d.path()), "r.example").is_err());
    }
}
