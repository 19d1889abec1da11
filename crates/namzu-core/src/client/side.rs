//! The streams of their own a link opens beside its HTTP/2 connection:
//! an egress connection's, and a streamed read's or write's, each a fresh
//! dial presenting the link's token in its own form of the preface.

use super::link::*;

/// An egress connection's own stream to the agent.
pub enum EgressStream {
    /// On a unix socket, so the host can splice it; `handoff`: opened with
    /// the handoff form, so the agent's offer ([`namzu_proto::handoff`])
    /// comes first.
    Unix {
        /// The stream, past its preface.
        stream: tokio::net::UnixStream,
        /// Whether the agent's handoff offer comes first.
        handoff: bool,
    },
    /// On another transport.
    Other(Box<dyn LinkStreamObj>),
}

impl AgentClient {
    /// Opens a byte stream of its own for egress ask `ask` (the egress form
    /// of the preface): the host's end of that connection, raw, instead of
    /// an `EgressSplice` call. `None` where the link cannot dial cheaply or
    /// the agent does not offer it.
    pub async fn open_egress_stream(&self, ask: u64) -> Option<Result<EgressStream>> {
        let (dial, token) = self.inner.side.as_ref()?;
        if !self.inner.features.contains(feat::EGRESS_STREAM) {
            return None;
        }
        let endpoint = || format!("egress stream of {}", self.inner.sandbox_id);
        let opened = async {
            let connect = |source| Error::Connect {
                endpoint: endpoint(),
                source,
            };
            let refused = |source| Error::Preface {
                endpoint: endpoint(),
                source,
            };
            Ok(match dial {
                SideDial::Unix(dial) => {
                    let handoff = self.inner.features.contains(feat::EGRESS_HANDOFF);
                    let mut s = dial().await.map_err(connect)?;
                    namzu_proto::preface::offer_egress(&mut s, &token(), ask, handoff)
                        .await
                        .map_err(refused)?;
                    EgressStream::Unix { stream: s, handoff }
                }
                SideDial::Other(dialer) => {
                    let mut s = dialer().await.map_err(connect)?;
                    namzu_proto::preface::offer_egress(&mut s, &token(), ask, false)
                        .await
                        .map_err(refused)?;
                    EgressStream::Other(s)
                }
            })
        };
        Some(opened.await)
    }

    /// Opens a unix stream of its own for a streamed read (the read form
    /// of the preface, with `request` an encoded `ReadFileStreamRequest`).
    /// `None` where the link is not a unix socket or the agent does not
    /// offer it.
    pub(super) async fn open_side_read(&self, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        self.open_side(false, request).await
    }

    /// Opens a unix stream of its own for a write (the write form of the
    /// preface, with `request` an encoded `WriteBegin`); `None` as for
    /// [`Self::open_side_read`].
    pub(super) async fn open_side_write(&self, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        self.open_side(true, request).await
    }

    async fn open_side(&self, write: bool, request: &[u8]) -> Option<Result<tokio::net::UnixStream>> {
        let (SideDial::Unix(dial), token) = self.inner.side.as_ref()? else {
            return None;
        };
        let (feature, what) = if write {
            (feat::FILES_WRITE_SIDE, "write")
        } else {
            (feat::FILES_READ_SIDE, "read")
        };
        if !self.inner.features.contains(feature) {
            return None;
        }
        let endpoint = || format!("{what} stream of {}", self.inner.sandbox_id);
        let opened = async {
            let mut s = dial().await.map_err(|source| Error::Connect {
                endpoint: endpoint(),
                source,
            })?;
            let offered = if write {
                namzu_proto::preface::offer_write(&mut s, &token(), request).await
            } else {
                namzu_proto::preface::offer_read(&mut s, &token(), request).await
            };
            offered.map_err(|source| Error::Preface {
                endpoint: endpoint(),
                source,
            })?;
            Ok(s)
        };
        Some(opened.await)
    }
}
