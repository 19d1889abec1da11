//! The dial-back challenge: how a host that *listens* for its agent (the
//! agent connects out, e.g. from inside gVisor, which lets a sandbox connect
//! to a host unix socket but not listen on one) knows the caller is the
//! agent before it offers the bind token on that stream.
//!
//! ```text
//! host -> agent:  "NZB1" | nonce: 16 random bytes
//! agent -> host:  HMAC-SHA256(key = token, "namzu dial-back v1" | nonce)
//! ```
//!
//! After that the stream is an ordinary fresh stream: the host sends one of
//! the preface's forms ([`crate::preface`]) when it wants it, and the agent
//! checks the token as for any dial. The proof never reveals the token, a
//! fresh nonce per stream makes a recorded proof worthless, and a peer that
//! cannot prove gets the stream closed without a byte of the token.

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Magic and version of the challenge.
pub const MAGIC: [u8; 4] = *b"NZB1";
/// Length of the host's nonce.
pub const NONCE_LEN: usize = 16;
/// Length of the agent's proof.
pub const PROOF_LEN: usize = 32;
const CONTEXT: &[u8] = b"namzu dial-back v1";
/// What an agent writes in the directory it dials from when the boundary
/// forbids connecting out (the host then reaches it another way).
pub const UNSUPPORTED: &str = "unsupported";

/// Why a dial-back stream was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum BackError {
    #[error("dial-back: {0}")]
    Io(#[from] std::io::Error),
    #[error("dial-back: the challenge's magic is wrong")]
    BadMagic,
    #[error("dial-back: the peer's proof does not match the token")]
    BadProof,
    #[error("dial-back: no randomness for a nonce")]
    Random,
}

fn proof(token: &[u8], nonce: &[u8]) -> hmac::Tag {
    let key = hmac::Key::new(hmac::HMAC_SHA256, token);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(CONTEXT);
    ctx.update(nonce);
    ctx.sign()
}

/// Host side: challenges the peer that just connected and returns once it
/// proved it holds `token`. The caller bounds the time this may take.
pub async fn challenge<S>(stream: &mut S, token: &[u8]) -> Result<(), BackError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; 4 + NONCE_LEN];
    hello[..4].copy_from_slice(&MAGIC);
    SystemRandom::new()
        .fill(&mut hello[4..])
        .map_err(|_| BackError::Random)?;
    stream.write_all(&hello).await?;
    stream.flush().await?;
    let mut got = [0u8; PROOF_LEN];
    stream.read_exact(&mut got).await?;
    let key = hmac::Key::new(hmac::HMAC_SHA256, token);
    let mut msg = CONTEXT.to_vec();
    msg.extend_from_slice(&hello[4..]);
    hmac::verify(&key, &msg, &got).map_err(|_| BackError::BadProof)
}

/// Agent side: answers the host's challenge on a stream it dialed.
pub async fn answer<S>(stream: &mut S, token: &[u8]) -> Result<(), BackError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; 4 + NONCE_LEN];
    stream.read_exact(&mut hello).await?;
    if hello[..4] != MAGIC {
        return Err(BackError::BadMagic);
    }
    stream.write_all(proof(token, &hello[4..]).as_ref()).await?;
    stream.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_right_token_proves_and_a_wrong_one_does_not() {
        for (agent_token, ok) in [(&b"secret"[..], true), (&b"guess"[..], false)] {
            let (mut host, mut agent) = tokio::io::duplex(256);
            let a = tokio::spawn({
                let t = agent_token.to_vec();
                async move { answer(&mut agent, &t).await }
            });
            let verdict = challenge(&mut host, b"secret").await;
            a.await.unwrap().unwrap();
            assert_eq!(verdict.is_ok(), ok, "{verdict:?}");
            if !ok {
                assert!(matches!(verdict, Err(BackError::BadProof)));
            }
        }
    }

    #[tokio::test]
    async fn a_replayed_proof_fails_against_a_fresh_nonce() {
        // Record one exchange, then answer the next challenge with it.
        let (mut host, mut agent) = tokio::io::duplex(256);
        let a = tokio::spawn(async move {
            answer(&mut agent, b"secret").await.unwrap();
        });
        challenge(&mut host, b"secret").await.unwrap();
        a.await.unwrap();
        let recorded = proof(b"secret", &[0u8; NONCE_LEN]);
        let (mut host, mut fake) = tokio::io::duplex(256);
        let f = tokio::spawn(async move {
            let mut hello = [0u8; 4 + NONCE_LEN];
            fake.read_exact(&mut hello).await.unwrap();
            fake.write_all(recorded.as_ref()).await.unwrap();
        });
        assert!(matches!(
            challenge(&mut host, b"secret").await,
            Err(BackError::BadProof)
        ));
        f.await.unwrap();
    }

    #[tokio::test]
    async fn the_agent_refuses_a_stream_that_is_not_a_challenge() {
        let (mut host, mut agent) = tokio::io::duplex(256);
        host.write_all(&[b'N', b'Z', b'L', b'2', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            .await
            .unwrap();
        assert!(matches!(answer(&mut agent, b"secret").await, Err(BackError::BadMagic)));
    }
}
