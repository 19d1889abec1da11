//! Writes on a unix stream of their own (the write form of the preface):
//! the link's atomic replace and typed errors, the old file kept whenever a
//! write does not finish, the agent's own bound on them, and the link as
//! the fallback.

use namzu_proto::side_read::{self as frames};

use super::*;

fn pattern(n: u32) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect()
}

/// Opens a write of `path` by hand; the tag of the agent's first frame and
/// the stream.
async fn open_by_hand(a: &Agent, path: &str) -> (u8, Vec<u8>, tokio::net::UnixStream) {
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let begin = namzu_proto::v1::WriteBegin {
        path: Bytes::copy_from_slice(path.as_bytes()),
        mode: None,
        create_parents: false,
    };
    namzu_proto::preface::offer_write(&mut s, TOKEN, &prost::Message::encode_to_vec(&begin))
        .await
        .unwrap();
    let mut h = [0u8; frames::HEADER_LEN];
    s.read_exact(&mut h).await.unwrap();
    let (tag, len) = frames::parse_header(&h);
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.unwrap();
    (tag, body, s)
}

/// Waits until nothing but `names` is left in `dir` (a dropped write's
/// temporary is removed by the agent once it sees the stream end).
async fn only(dir: &Path, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        if left == names || Instant::now() > deadline {
            assert_eq!(left, names);
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_write_rides_a_stream_of_its_own_atomically_with_the_links_errors() {
    let a = spawn_unix(&[("NAMZU_MAX_WRITE_BYTES", "30000000")]).await;
    let c = connect(&a).await.unwrap();
    assert!(c
        .info()
        .features
        .iter()
        .any(|f| f == namzu_proto::features::FILES_WRITE_SIDE));
    // Over one frame (1 MiB), from memory and from a reader.
    let content = pattern(20_000_000);
    let n = c
        .write_file(
            Path::new("big.bin"),
            Bytes::from(content.clone()),
            WriteOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(n, content.len() as u64);
    assert!(
        std::fs::read(a.root().join("big.bin")).unwrap() == content,
        "bytes differ"
    );
    let again = pattern(3_000_001);
    let reader = std::io::Cursor::new(again.clone());
    c.write_file_from(Path::new("big.bin"), reader, WriteOptions::default())
        .await
        .unwrap();
    assert!(
        std::fs::read(a.root().join("big.bin")).unwrap() == again,
        "streamed bytes differ"
    );
    // The link's typed errors, the old file kept.
    std::fs::create_dir(a.root().join("dir")).unwrap();
    assert!(matches!(
        c.write_file(Path::new("dir"), Bytes::from_static(b"x"), WriteOptions::default())
            .await,
        Err(Error::IsADirectory { .. })
    ));
    assert!(matches!(
        c.write_file(
            Path::new("../outside"),
            Bytes::from_static(b"x"),
            WriteOptions::default()
        )
        .await,
        Err(Error::PathEscape { .. } | Error::PermissionDenied { .. })
    ));
    let too_big = Bytes::from(vec![7u8; 31_000_000]);
    match c
        .write_file(Path::new("big.bin"), too_big, WriteOptions::default())
        .await
    {
        Err(Error::LimitExceeded { limit, .. }) => assert_eq!(limit, "max_write_bytes"),
        other => panic!("{other:?}"),
    }
    assert!(
        std::fs::read(a.root().join("big.bin")).unwrap() == again,
        "a refused write changed the file"
    );
    // A reader that fails part-way: a local error, the old file kept.
    let failing = tokio::io::AsyncReadExt::chain(std::io::Cursor::new(vec![1u8; 2_500_000]), FailingReader);
    assert!(matches!(
        c.write_file_from(Path::new("big.bin"), failing, WriteOptions::default())
            .await,
        Err(Error::LocalIo { .. })
    ));
    assert!(std::fs::read(a.root().join("big.bin")).unwrap() == again);
    only(&a.root(), &["big.bin", "dir"]).await;
}

/// Fails every read.
struct FailingReader;
impl tokio::io::AsyncRead for FailingReader {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::Error::other("the source broke")))
    }
}

#[tokio::test]
async fn a_stream_that_ends_before_its_end_frame_replaces_nothing() {
    let a = spawn_unix(&[]).await;
    std::fs::write(a.root().join("f"), b"old").unwrap();
    // Cut mid-frame, and after whole frames but before END.
    for cut_mid_frame in [true, false] {
        let (tag, _, mut s) = open_by_hand(&a, "f").await;
        assert_eq!(tag, frames::READY);
        s.write_all(&frames::header(frames::DATA, 10)).await.unwrap();
        s.write_all(if cut_mid_frame { b"new" } else { b"new bytes!" })
            .await
            .unwrap();
        drop(s);
        only(&a.root(), &["f"]).await;
        assert_eq!(std::fs::read(a.root().join("f")).unwrap(), b"old");
    }
    // An END whose total is not what was sent: refused, old file kept.
    let (_, _, mut s) = open_by_hand(&a, "f").await;
    s.write_all(&frames::header(frames::DATA, 3)).await.unwrap();
    s.write_all(b"new").await.unwrap();
    s.write_all(&frames::header(frames::END, 4)).await.unwrap();
    let mut h = [0u8; frames::HEADER_LEN];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(frames::parse_header(&h).0, frames::ERROR);
    assert_eq!(std::fs::read(a.root().join("f")).unwrap(), b"old");
    // A wrong token gets nothing.
    let mut s = tokio::net::UnixStream::connect(a.sock()).await.unwrap();
    let r = namzu_proto::preface::offer_write(&mut s, b"not-the-token", b"").await;
    assert_eq!(r, Err(PrefaceError::Refused));
}

#[tokio::test]
async fn past_its_bound_or_withheld_the_agent_declines_and_the_client_writes_over_the_link() {
    let content = Bytes::from(b"over the link all the same\n".repeat(10_000));
    let a = spawn_unix(&[("NAMZU_MAX_SIDE_WRITES", "0")]).await;
    let (tag, _, _) = open_by_hand(&a, "f").await;
    assert_eq!(tag, frames::BUSY);
    let c = connect(&a).await.unwrap();
    c.write_file(Path::new("f"), content.clone(), WriteOptions::default())
        .await
        .unwrap();
    assert!(std::fs::read(a.root().join("f")).unwrap() == content);

    let a = spawn_unix(&[("NAMZU_DISABLED_FEATURES", "files.write-side")]).await;
    let (tag, body, _) = open_by_hand(&a, "f").await;
    assert_eq!(tag, frames::ERROR);
    let (_, message, _) = frames::decode_status(&body).unwrap();
    assert!(message.contains("feature disabled"), "{message}");
    let c = connect(&a).await.unwrap();
    assert!(!c
        .info()
        .features
        .iter()
        .any(|f| f == namzu_proto::features::FILES_WRITE_SIDE));
    c.write_file(Path::new("f"), content.clone(), WriteOptions::default())
        .await
        .unwrap();
    assert!(std::fs::read(a.root().join("f")).unwrap() == content);
}
