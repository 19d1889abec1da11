//! Streamed reads on a unix stream of their own (the read form of the
//! preface): the bytes and the errors of the link's `ReadFileStream`, the
//! agent's own bound on them, and the link as the fallback.

use namzu::ByteRange;
use namzu_proto::side_read::{self as frames};

use super::*;

/// The bytes a client's streamed read yields.
async fn streamed(c: &AgentClient, path: &str, range: Option<ByteRange>) -> namzu::Result<Vec<u8>> {
    let mut s = c.read_file_stream(Path::new(path), range).await?;
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// A read asked by hand on a stream of its own: the frames' tags, and the
/// data frames' bytes joined.
async fn by_hand(a: &Agent, path: &str) -> (Vec<u8>, Vec<u8>) {
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let req = namzu_proto::v1::ReadFileStreamRequest {
        path: Bytes::copy_from_slice(path.as_bytes()),
        offset: 0,
        length: None,
    };
    namzu_proto::preface::offer_read(&mut s, TOKEN, &prost::Message::encode_to_vec(&req))
        .await
        .unwrap();
    let (mut tags, mut data) = (Vec::new(), Vec::new());
    loop {
        let mut h = [0u8; frames::HEADER_LEN];
        if s.read_exact(&mut h).await.is_err() {
            return (tags, data);
        }
        let (tag, len) = frames::parse_header(&h);
        tags.push(tag);
        let mut body = vec![0u8; len as usize];
        s.read_exact(&mut body).await.unwrap();
        match tag {
            frames::DATA => data.extend_from_slice(&body),
            frames::ERROR => {
                let (code, message, _) = frames::decode_status(&body).unwrap();
                data = format!("{code} {message}").into_bytes();
            }
            _ => {}
        }
        if tag != frames::DATA {
            return (tags, data);
        }
    }
}

#[tokio::test]
async fn a_streamed_read_rides_a_stream_of_its_own_with_the_links_bytes_and_errors() {
    let a = spawn_unix(&[]).await;
    // Over one data frame (8 MiB), so the stream carries several.
    let content: Vec<u8> = (0..20_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(a.root().join("big.bin"), &content).unwrap();
    std::fs::create_dir(a.root().join("dir")).unwrap();
    let c = connect(&a).await.unwrap();
    assert!(c
        .info()
        .features
        .iter()
        .any(|f| f == namzu_proto::features::FILES_READ_SIDE));

    assert!(
        streamed(&c, "big.bin", None).await.unwrap() == content,
        "whole file differs"
    );
    let range = ByteRange {
        offset: 9_000_000,
        length: Some(3_000_001),
    };
    assert!(
        streamed(&c, "big.bin", Some(range)).await.unwrap() == content[9_000_000..12_000_001],
        "range differs"
    );
    let past_end = ByteRange {
        offset: 30_000_000,
        length: None,
    };
    assert!(streamed(&c, "big.bin", Some(past_end)).await.unwrap().is_empty());
    // The link's typed errors, at the call.
    match c.read_file_stream(Path::new("missing"), None).await.err() {
        Some(Error::NotFound { path, .. }) => assert_eq!(path, Path::new("missing")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.read_file_stream(Path::new("dir"), None).await.err(),
        Some(Error::IsADirectory { .. })
    ));
    assert!(matches!(
        c.read_file_stream(Path::new("../../etc/passwd"), None).await.err(),
        Some(Error::PathEscape { .. } | Error::PermissionDenied { .. })
    ));

    // The stream itself: data frames (several), then the end.
    let (tags, data) = by_hand(&a, "big.bin").await;
    assert!(data == content, "by hand: bytes differ");
    assert_eq!(tags.iter().filter(|t| **t == frames::DATA).count(), 3, "{tags:?}");
    assert_eq!(tags.last(), Some(&frames::END));
    // A wrong token gets nothing.
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let r = namzu_proto::preface::offer_read(&mut s, b"not-the-token", b"").await;
    assert_eq!(r, Err(PrefaceError::Refused));
}

#[tokio::test]
async fn past_its_bound_or_withheld_the_agent_declines_and_the_client_reads_over_the_link() {
    let content = b"over the link all the same\n".repeat(10_000);
    // No side reads at all: every one is declined as busy.
    let a = spawn_unix(&[("NAMZU_MAX_SIDE_READS", "0")]).await;
    std::fs::write(a.root().join("f"), &content).unwrap();
    let (tags, data) = by_hand(&a, "f").await;
    assert_eq!((tags, data), (vec![frames::BUSY], vec![]));
    let c = connect(&a).await.unwrap();
    assert!(streamed(&c, "f", None).await.unwrap() == content);

    // The feature withheld: not advertised, refused by hand, the link used.
    let a = spawn_unix(&[("NAMZU_DISABLED_FEATURES", "files.read-side")]).await;
    std::fs::write(a.root().join("f"), &content).unwrap();
    let (tags, data) = by_hand(&a, "f").await;
    assert_eq!(tags, vec![frames::ERROR]);
    assert!(
        String::from_utf8_lossy(&data).contains("feature disabled"),
        "{}",
        String::from_utf8_lossy(&data)
    );
    let c = connect(&a).await.unwrap();
    assert!(!c
        .info()
        .features
        .iter()
        .any(|f| f == namzu_proto::features::FILES_READ_SIDE));
    assert!(streamed(&c, "f", None).await.unwrap() == content);
}
