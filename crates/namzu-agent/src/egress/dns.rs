//! The sandbox's resolver: UDP on 127.0.0.1:53, A and AAAA only, every
//! question asked of the host. Messages are read and written by
//! `hickory-proto`, the DNS message format of the hickory resolver.
//!
//! Answers: the host's addresses (TTL [`TTL`]); REFUSED when the policy
//! says no (under no-network, every name); SERVFAIL when the host could
//! not resolve; NODATA for other record types; FORMERR for what it cannot
//! read.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use namzu_proto::v1::{egress_ask, EgressResolve};
use tokio::net::UdpSocket;

use super::{Answer, Broker};

/// Seconds a client may keep an answer; short, so a policy change is seen.
pub const TTL: u32 = 5;

/// A UDP answer without EDNS must fit this; as many records as do.
const UDP_PAYLOAD: usize = 512;
/// The most a reply to an EDNS query holds, whatever the client offers:
/// the size DNS flag day 2020 settled on, below any path's MTU.
const EDNS_PAYLOAD: u16 = 1232;
/// Bytes of the OPT record a reply to an EDNS query carries.
const OPT_BYTES: usize = 11;
const RCODE_FORMERR: u8 = 1;

pub fn spawn(broker: Arc<Broker>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1500];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let query = buf[..n].to_vec();
            let (b, s) = (broker.clone(), socket.clone());
            tokio::spawn(async move {
                let reply = answer(&b, &query).await;
                if let Some(r) = reply {
                    let _ = s.send_to(&r, peer).await;
                }
            });
        }
    });
}

/// One question, as read from a query.
#[derive(Debug, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    pub recursion_desired: bool,
    /// The name asked, without the root's trailing dot.
    pub name: String,
    pub qtype: RecordType,
    pub qclass: DNSClass,
    /// The payload the client takes, where it asked with EDNS (RFC 6891:
    /// then the reply carries an OPT record too).
    pub edns_payload: Option<u16>,
    /// The question itself, echoed in the reply.
    query: Query,
}

/// Reads a query and its first question; `None` for anything else (a
/// response, a message that does not decode, no question).
pub fn parse(msg: &[u8]) -> Option<Question> {
    let m = Message::from_vec(msg).ok()?;
    if m.metadata.message_type != MessageType::Query {
        return None;
    }
    let edns_payload = m.edns.as_ref().map(|e| e.max_payload().max(512));
    let query = m.queries.into_iter().next()?;
    Some(Question {
        edns_payload,
        id: m.metadata.id,
        recursion_desired: m.metadata.recursion_desired,
        name: query.name().to_ascii().trim_end_matches('.').to_owned(),
        qtype: query.query_type(),
        qclass: query.query_class(),
        query,
    })
}

/// A reply to `q` with `rcode` and address records (those of the asked
/// family, as many as fit the payload the client takes: 512 bytes, or
/// with EDNS what it offers up to [`EDNS_PAYLOAD`]).
pub fn reply(q: &Question, rcode: ResponseCode, addrs: &[IpAddr]) -> Vec<u8> {
    let mut r = Message::new(q.id, MessageType::Response, hickory_proto::op::OpCode::Query);
    r.metadata.recursion_desired = q.recursion_desired;
    r.metadata.recursion_available = true;
    r.metadata.response_code = rcode;
    let v6 = q.qtype == RecordType::AAAA;
    // Each record names the question by a pointer (2 bytes), then type,
    // class, TTL, length (10) and the address.
    let record = if v6 { 12 + 16 } else { 12 + 4 };
    let question = q.query.to_bytes().map_or(UDP_PAYLOAD, |b| b.len());
    let payload = match q.edns_payload {
        Some(offered) => {
            let size = offered.min(EDNS_PAYLOAD);
            let mut edns = hickory_proto::op::Edns::new();
            edns.set_max_payload(size);
            r.edns = Some(edns);
            usize::from(size) - OPT_BYTES
        }
        None => UDP_PAYLOAD,
    };
    let room = payload.saturating_sub(12 + question) / record;
    let name = q.query.name().clone();
    r.add_query(q.query.clone());
    for a in addrs.iter().filter(|a| a.is_ipv6() == v6).take(room) {
        let data = match a {
            IpAddr::V4(v4) => RData::A(A(*v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
        };
        r.add_answer(Record::from_rdata(name.clone(), TTL, data));
    }
    r.to_vec().unwrap_or_default()
}

async fn answer(broker: &Broker, query: &[u8]) -> Option<Vec<u8>> {
    let Some(q) = parse(query) else {
        // Enough of a header to say FORMERR to; otherwise silence.
        if query.len() >= 12 {
            let mut r = query[..12].to_vec();
            r[2] = 0x80;
            r[3] = 0x80 | RCODE_FORMERR;
            r[4..12].fill(0);
            return Some(r);
        }
        return None;
    };
    if q.qclass != DNSClass::IN || !matches!(q.qtype, RecordType::A | RecordType::AAAA) {
        return Some(reply(&q, ResponseCode::NoError, &[]));
    }
    let asked = broker
        .ask(egress_ask::What::Resolve(EgressResolve {
            name: q.name.clone(),
            ipv6: q.qtype == RecordType::AAAA,
        }))
        .await;
    Some(match asked {
        Answer::Addresses(a) if a.is_empty() => reply(&q, ResponseCode::NXDomain, &[]),
        Answer::Addresses(a) => reply(&q, ResponseCode::NoError, &a),
        Answer::Refused(_) => reply(&q, ResponseCode::Refused, &[]),
        Answer::Failed(_) | Answer::Spliced(_) => reply(&q, ResponseCode::ServFail, &[]),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TYPE_A: u16 = 1;
    const TYPE_AAAA: u16 = 28;

    /// A query written by hand, byte by byte, as a client's resolver sends it.
    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for l in name.split('.') {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&1u16.to_be_bytes());
        m
    }

    #[test]
    fn a_query_is_read_and_answered() {
        let raw = query(0x1234, "api.example.com", TYPE_A);
        let q = parse(&raw).unwrap();
        assert_eq!(
            (q.id, q.name.as_str(), q.qtype, q.recursion_desired),
            (0x1234, "api.example.com", RecordType::A, true)
        );
        let addrs: Vec<IpAddr> = vec!["203.0.113.5".parse().unwrap(), "2001:db8::5".parse().unwrap()];
        let r = reply(&q, ResponseCode::NoError, &addrs);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[2] & 0x80, 0x80, "a response");
        assert_eq!(r[2] & 0x01, 0x01, "RD echoed");
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[4], r[5]]), 1, "the question");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "only the A record");
        // The question as asked, byte for byte.
        assert_eq!(&r[12..raw.len()], &raw[12..]);
        assert_eq!(&r[r.len() - 4..], &[203, 0, 113, 5]);
        let refused = reply(&q, ResponseCode::Refused, &[]);
        assert_eq!(refused[3] & 0x0f, 5);
        assert_eq!(u16::from_be_bytes([refused[6], refused[7]]), 0);
    }

    #[test]
    fn an_answer_fits_a_udp_datagram() {
        let q = parse(&query(7, "many.example.com", TYPE_AAAA)).unwrap();
        let addrs: Vec<IpAddr> = (0..100u16)
            .map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]))
            .collect();
        let r = reply(&q, ResponseCode::NoError, &addrs);
        assert!(r.len() <= UDP_PAYLOAD, "{}", r.len());
        assert!(u16::from_be_bytes([r[6], r[7]]) >= 10);
    }

    /// An EDNS query gets an OPT record back and as many records as the
    /// payload it offers holds, never more than the bound.
    #[test]
    fn an_edns_query_gets_edns_and_its_payload() {
        let mut raw = query(9, "many.example.com", TYPE_AAAA);
        raw[11] = 1; // ARCOUNT
                     // OPT: root name, type 41, class = payload 4096, TTL 0, no data.
        raw.extend_from_slice(&[0, 0, 41, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);
        let q = parse(&raw).unwrap();
        assert_eq!(q.edns_payload, Some(4096));
        let addrs: Vec<IpAddr> = (0..100u16)
            .map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]))
            .collect();
        let r = reply(&q, ResponseCode::NoError, &addrs);
        assert!(r.len() <= usize::from(EDNS_PAYLOAD), "{}", r.len());
        let back = Message::from_vec(&r).unwrap();
        assert_eq!(back.edns.as_ref().map(|e| e.max_payload()), Some(EDNS_PAYLOAD));
        assert!(back.answers.len() > 30, "{}", back.answers.len());
        assert!(parse(&query(9, "many.example.com", TYPE_AAAA))
            .unwrap()
            .edns_payload
            .is_none());
    }

    #[test]
    fn responses_and_garbage_are_not_questions() {
        let mut r = query(1, "a.example", TYPE_A);
        r[2] |= 0x80;
        assert_eq!(parse(&r), None);
        assert_eq!(parse(&[0; 5]), None);
        let mut truncated = query(1, "a.example", TYPE_A);
        truncated.truncate(truncated.len() - 3);
        assert_eq!(parse(&truncated), None);
        // A name that points at itself never ends.
        let mut looped = query(1, "a", TYPE_A);
        looped.splice(12..15, [0xc0, 12]);
        assert_eq!(parse(&looped), None);
    }
}
