//! The payload cipher of encrypted queues (`encryptionEnabled`): the application seals a
//! payload before it is proposed, so the log, the store and snapshots hold only the sealed
//! form, and opens it wherever a payload leaves the node (pops, `fetch`, dead letters, the lake).

/// What opening a stored payload found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// The payload is not a sealed envelope: it is served as stored.
    NotSealed,
    /// The plaintext.
    Plain(Vec<u8>),
    /// An envelope this node cannot open (no key, another key, or changed bytes): served as
    /// stored, and written into the lake as a JSON string of the stored bytes.
    Undecryptable,
}

/// Seals and opens payloads.
pub trait PayloadCipher: Send + Sync + 'static {
    /// The stored form of `plain` (a JSON document, so it is a valid payload itself).
    ///
    /// # Errors
    /// No key on this node, or the crypto library failed; the message must not be stored.
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String>;
    /// Open a stored payload, deciding by its shape whether it is sealed.
    fn open(&self, stored: &[u8]) -> Opened;
}
