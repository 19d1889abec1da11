//! The preface parser must never panic, never accept a token longer than the
//! bound, and accept exactly what `encode` produced.
#![no_main]

use libfuzzer_sys::fuzz_target;
use namzu_proto::preface::{encode, parse, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let max = 64;
    if let Ok(Some((token, used))) = parse(data, max) {
        assert!(!token.is_empty() && token.len() <= max);
        assert_eq!(used, HEADER_LEN + token.len());
        assert_eq!(&encode(token).unwrap()[..], &data[..used]);
    }
    // Every prefix of a valid preface is "need more", never an error.
    if let Ok(enc) = encode(&data[..data.len().min(max)]) {
        for cut in 0..enc.len() {
            assert_eq!(parse(&enc[..cut], max), Ok(None));
        }
    }
});
