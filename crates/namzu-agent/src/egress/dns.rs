//! The sandbox's resolver: UDP on 127.0.0.1:53, A and AAAA only, every
//! question asked of the host. Hand-written rather than a DNS crate: it
//! reads one question and writes address records, and the agent is one
//! static binary that goes into every sandbox.
//!
//! Answers: the host's addresses (TTL [`TTL`]); REFUSED when the policy
//! says no (under no-network, every name); SERVFAIL when the host could
//! not resolve; NODATA for other record types; FORMERR for what it cannot
//! read.

use std::net::IpAddr;
use std::sync::Arc;

use namzu_proto::v1::{egress_ask, EgressResolve};
use tokio::net::UdpSocket;

use super::{Answer, Broker};

/// Seconds a client may keep an answer; short, so a policy change is seen.
pub const TTL: u32 = 5;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u8 = 1;
const RCODE_SERVFAIL: u8 = 2;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_REFUSED: u8 = 5;

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
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// The question's bytes (name, type, class), echoed in the reply.
    pub raw: Vec<u8>,
}

/// Reads the header and the first question; `None` for anything else.
pub fn parse(msg: &[u8]) -> Option<Question> {
    if msg.len() < 12 || msg[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if qdcount == 0 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*msg.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        // No compression pointers in a question's name.
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(msg.get(i..i + len)?).into_owned());
        i += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(i)?, *msg.get(i + 1)?]);
    let qclass = u16::from_be_bytes([*msg.get(i + 2)?, *msg.get(i + 3)?]);
    Some(Question {
        id,
        recursion_desired: msg[2] & 0x01 != 0,
        name: labels.join("."),
        qtype,
        qclass,
        raw: msg[12..i + 4].to_vec(),
    })
}

/// A reply to `q` with `rcode` and address records.
pub fn reply(q: &Question, rcode: u8, addrs: &[IpAddr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(&q.id.to_be_bytes());
    out.push(0x80 | u8::from(q.recursion_desired)); // QR, RD echoed
    out.push(0x80 | (rcode & 0x0f)); // RA
    out.extend_from_slice(&1u16.to_be_bytes());
    // A UDP answer without EDNS must fit 512 bytes: as many records as do.
    let record = if q.qtype == TYPE_AAAA { 12 + 16 } else { 12 + 4 };
    let room = 512usize.saturating_sub(12 + q.raw.len()) / record;
    let answers: Vec<&IpAddr> = addrs
        .iter()
        .filter(|a| a.is_ipv6() == (q.qtype == TYPE_AAAA))
        .take(room)
        .collect();
    out.extend_from_slice(&u16::try_from(answers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&q.raw);
    for a in answers {
        out.extend_from_slice(&[0xc0, 12]); // the question's name
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        match a {
            IpAddr::V4(v4) => {
                out.extend_from_slice(&4u16.to_be_bytes());
                out.extend_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.extend_from_slice(&16u16.to_be_bytes());
                out.extend_from_slice(&v6.octets());
            }
        }
    }
    out
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
    if q.qclass != CLASS_IN || !(q.qtype == TYPE_A || q.qtype == TYPE_AAAA) {
        return Some(reply(&q, 0, &[]));
    }
    let asked = broker
        .ask(egress_ask::What::Resolve(EgressResolve {
            name: q.name.clone(),
            ipv6: q.qtype == TYPE_AAAA,
        }))
        .await;
    Some(match asked {
        Answer::Addresses(a) if a.is_empty() => reply(&q, RCODE_NXDOMAIN, &[]),
        Answer::Addresses(a) => reply(&q, 0, &a),
        Answer::Refused(_) => reply(&q, RCODE_REFUSED, &[]),
        Answer::Failed(_) | Answer::Spliced(_) => reply(&q, RCODE_SERVFAIL, &[]),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut m = id.to_be_bytes().to_vec();
        m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for l in name.split('.') {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&CLASS_IN.to_be_bytes());
        m
    }

    #[test]
    fn a_query_is_read_and_answered() {
        let q = parse(&query(0x1234, "api.example.com", TYPE_A)).unwrap();
        assert_eq!(
            (q.id, q.name.as_str(), q.qtype, q.recursion_desired),
            (0x1234, "api.example.com", TYPE_A, true)
        );
        let addrs: Vec<IpAddr> = vec!["203.0.113.5".parse().unwrap(), "2001:db8::5".parse().unwrap()];
        let r = reply(&q, 0, &addrs);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[2] & 0x80, 0x80, "a response");
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1, "only the A record");
        assert_eq!(&r[r.len() - 4..], &[203, 0, 113, 5]);
        let refused = reply(&q, RCODE_REFUSED, &[]);
        assert_eq!(refused[3] & 0x0f, RCODE_REFUSED);
        assert_eq!(u16::from_be_bytes([refused[6], refused[7]]), 0);
    }

    #[test]
    fn an_answer_fits_a_udp_datagram() {
        let q = parse(&query(7, "many.example.com", TYPE_AAAA)).unwrap();
        let addrs: Vec<IpAddr> = (0..100u16)
            .map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]))
            .collect();
        let r = reply(&q, 0, &addrs);
        assert!(r.len() <= 512, "{}", r.len());
        assert!(u16::from_be_bytes([r[6], r[7]]) >= 10);
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
    }
}
