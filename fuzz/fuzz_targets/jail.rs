//! The lexical half of the path jail: whatever bytes arrive, a located path
//! has no `..`, no NUL, and lies under the root it names.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use namzu_agent::jail::locate_in;

fuzz_target!(|data: &[u8]| {
    let roots = [Path::new("/srv/ws"), Path::new("/data/x")];
    if let Ok(loc) = locate_in(roots.iter().copied(), data) {
        assert!(loc.root < roots.len());
        assert!(!data.contains(&0));
        for c in loc.rel.components() {
            assert!(matches!(c, Component::Normal(_)), "{c:?} in {:?}", loc.rel);
        }
        let full = roots[loc.root].join(&loc.rel);
        assert!(full.starts_with(roots[loc.root]));
    }
});
