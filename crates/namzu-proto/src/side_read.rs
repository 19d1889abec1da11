//! The frames of a streamed read on a stream of its own (the read form of
//! the preface): after the agent's acceptance, a sequence of frames, each a
//! tag byte and a big-endian u64 length, then that many bytes:
//!
//! * [`DATA`]: file bytes, in order from the asked offset;
//! * [`END`] (length 0): the range is complete;
//! * [`ERROR`]: a failure as the RPC would have reported it, its status
//!   encoded by [`encode_status`]; nothing follows;
//! * [`BUSY`] (length 0, first and only): the agent serves as many side
//!   reads as it may; nothing was read, and the host asks over the link.
//!
//! The write form (`NZW1`) runs the other way: the agent answers with
//! [`READY`] (the target was checked and its temporary made), [`BUSY`] or
//! [`ERROR`]; after `READY` the host sends `DATA` frames and an `END` whose
//! length is the total it sent, and the agent answers `END` with the bytes
//! written (u64) and the file's mode (u32), or `ERROR`. A write whose stream
//! ends before the host's `END` replaces nothing.
//!
//! The exec form (`NZX1`) carries one command: the agent answers its
//! acceptance together with the first frame, then sends [`DATA`] frames,
//! each one encoded `ExecOutput` (`Started` first, then output, `Exit`
//! last) as the link's `Exec` call would have streamed them, or an
//! [`ERROR`] where the call would have failed. The host sends nothing
//! after the preface: its end closing is the call dropped, and the agent
//! kills the command as it does when an `Exec` call is reset.
//!
//! A stream that closes anywhere else (mid-frame, or with no `END`) is
//! broken, never a short file. Frames let the sender learn a length before
//! it sends (a file's size at that moment) and still fail with a typed
//! error after some bytes went.

/// File bytes.
pub const DATA: u8 = 1;
/// The range is complete.
pub const END: u8 = 2;
/// The read failed: an encoded status follows.
pub const ERROR: u8 = 3;
/// No capacity for another side stream: use the link.
pub const BUSY: u8 = 4;
/// A side write may send its bytes.
pub const READY: u8 = 5;
/// A frame's header: tag and length.
pub const HEADER_LEN: usize = 9;
/// The longest encoded status a host reads.
pub const MAX_STATUS_BYTES: u64 = 64 * 1024;
/// The longest encoded read request the agent reads in a preface.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A frame's header.
pub fn header(tag: u8, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = tag;
    h[1..].copy_from_slice(&len.to_be_bytes());
    h
}

/// Splits a frame's header into tag and length.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> (u8, u64) {
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[1..]);
    (h[0], u64::from_be_bytes(len))
}

/// A gRPC status as an [`ERROR`] frame's body: code (u32), message length
/// (u32), message, then the details as they are.
pub fn encode_status(code: i32, message: &str, details: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + message.len() + details.len());
    out.extend_from_slice(&(code as u32).to_be_bytes());
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(details);
    out
}

/// The inverse of [`encode_status`]: code, message, details; `None` for
/// bytes it did not make.
pub fn decode_status(b: &[u8]) -> Option<(i32, String, Vec<u8>)> {
    let code = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as i32;
    let len = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?) as usize;
    let message = String::from_utf8_lossy(b.get(8..8usize.checked_add(len)?)?).into_owned();
    Some((code, message, b[8 + len..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_survives_the_trip_and_garbage_is_refused() {
        let b = encode_status(5, "no such file: /x", b"\x0a\x03abc");
        assert_eq!(
            decode_status(&b),
            Some((5, "no such file: /x".to_owned(), b"\x0a\x03abc".to_vec()))
        );
        assert_eq!(decode_status(&b[..6]), None);
        let mut lying = b.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_status(&lying), None);
        assert_eq!(parse_header(&header(DATA, 1 << 40)), (DATA, 1 << 40));
    }
}
