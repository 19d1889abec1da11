//! The bind token, shared by every gate that checks a preface (the link
//! listener, dial-back) and replaceable while the agent runs: a microVM
//! forked from a snapshot is told its own token by its host
//! (`namzu_proto::mux_sync`), and from then on the snapshot's no longer
//! opens it.

use std::sync::{Arc, RwLock};

/// The token links present; cloning shares it.
#[derive(Debug, Clone)]
pub struct Token(Arc<RwLock<Arc<Vec<u8>>>>);

impl Token {
    /// A token holding `t`.
    pub fn new(t: Vec<u8>) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(t))))
    }

    /// The token now.
    pub fn get(&self) -> Arc<Vec<u8>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces it; prefaces read from here on need the new one.
    pub fn set(&self, t: Vec<u8>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(t);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_replaced_token_is_what_every_clone_sees() {
        let a = super::Token::new(b"old".to_vec());
        let b = a.clone();
        b.set(b"new".to_vec());
        assert_eq!(a.get().as_slice(), b"new");
    }
}
