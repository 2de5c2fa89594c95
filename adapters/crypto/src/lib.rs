//! queen-crypto: payload encryption of queues with `encryptionEnabled` (AES-256-GCM under
//! `QUEEN_ENCRYPTION_KEY`), behind the [`PayloadCipher`] port.
//!
//! Owns: the key's parsing (64 hex characters, never logged), the stored envelope
//! `{"encrypted":"<b64>","iv":"<b64 of 16 bytes>","authTag":"<b64 of 16 bytes>"}` (standard
//! base64 with padding; the first 12 bytes of the IV are the GCM nonce, as Queen 2.x does it,
//! so data moves between the two), sealing with a fresh random IV per message, and opening by
//! the stored bytes' shape: a payload that is such an envelope is decrypted, anything else is
//! not an envelope.
//! Must never depend on: the broker's use cases or any other adapter.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use queen_ports::{Opened, PayloadCipher};

/// `QUEEN_ENCRYPTION_KEY` that cannot be used, named (never its value).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not 64 hexadecimal characters.
    #[error(
        "QUEEN_ENCRYPTION_KEY must be exactly 64 hexadecimal characters (32 bytes); it has {0} characters or a non-hex one"
    )]
    Shape(usize),
    /// The crypto library refused the key or its random source failed.
    #[error("QUEEN_ENCRYPTION_KEY could not be loaded: {0}")]
    Library(&'static str),
}

/// AES-256-GCM under one key.
pub struct Aes256Gcm {
    key: LessSafeKey,
}

impl std::fmt::Debug for Aes256Gcm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Aes256Gcm(<key>)")
    }
}

const IV_BYTES: usize = 16;
const TAG_BYTES: usize = 16;

impl Aes256Gcm {
    /// A cipher from the key's 64 hex characters.
    ///
    /// # Errors
    /// A key of another length or with a non-hex character.
    pub fn from_hex(hex: &str) -> Result<Self, KeyError> {
        let hex = hex.trim();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(KeyError::Shape(hex.chars().count()));
        }
        let bytes: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| KeyError::Library("key"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
        })
    }
}

fn nonce(iv: &[u8; IV_BYTES]) -> Nonce {
    let mut n = [0u8; 12];
    n.copy_from_slice(&iv[..12]);
    Nonce::assume_unique_for_key(n)
}

/// The envelope's three fields, decoded.
fn envelope(stored: &[u8]) -> Option<(Vec<u8>, [u8; IV_BYTES], [u8; TAG_BYTES])> {
    // Cheap shape checks first: most payloads are not envelopes.
    let trimmed = stored.trim_ascii_start();
    if trimmed.first() != Some(&b'{') || memchr::memmem::find(stored, b"authTag\"").is_none() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(stored).ok()?;
    let o = v.as_object()?;
    let field = |k: &str| o.get(k)?.as_str().and_then(|s| STANDARD.decode(s).ok());
    let ct = field("encrypted")?;
    let iv: [u8; IV_BYTES] = field("iv")?.try_into().ok()?;
    let tag: [u8; TAG_BYTES] = field("authTag")?.try_into().ok()?;
    Some((ct, iv, tag))
}

impl PayloadCipher for Aes256Gcm {
    fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, String> {
        let mut iv = [0u8; IV_BYTES];
        aws_lc_rs::rand::fill(&mut iv).map_err(|_| "no random bytes for an IV".to_owned())?;
        let mut buf = plain.to_vec();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(&iv), Aad::empty(), &mut buf)
            .map_err(|_| "the payload could not be encrypted".to_owned())?;
        let doc = serde_json::json!({
            "encrypted": STANDARD.encode(&buf),
            "iv": STANDARD.encode(iv),
            "authTag": STANDARD.encode(tag.as_ref()),
        });
        Ok(doc.to_string().into_bytes())
    }

    fn open(&self, stored: &[u8]) -> Opened {
        let Some((ct, iv, tag)) = envelope(stored) else {
            return Opened::NotSealed;
        };
        let mut buf = ct;
        buf.extend_from_slice(&tag);
        match self.key.open_in_place(nonce(&iv), Aad::empty(), &mut buf) {
            Ok(plain) => {
                let n = plain.len();
                buf.truncate(n);
                Opened::Plain(buf)
            }
            Err(_) => Opened::Undecryptable,
        }
    }
}

/// What a node without a key does with stored payloads: it can tell an envelope, not open it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoKey;

impl PayloadCipher for NoKey {
    fn seal(&self, _plain: &[u8]) -> Result<Vec<u8>, String> {
        Err("this node has no QUEEN_ENCRYPTION_KEY".to_owned())
    }

    fn open(&self, stored: &[u8]) -> Opened {
        if envelope(stored).is_some() {
            Opened::Undecryptable
        } else {
            Opened::NotSealed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn a_sealed_payload_opens_to_its_bytes_and_hides_them() {
        let c = Aes256Gcm::from_hex(KEY).expect("key");
        let plain = br#"{"card":"4111 1111 1111 1111","n":123456789012345678901234567890}"#;
        let a = c.seal(plain).expect("sealed");
        let b = c.seal(plain).expect("sealed");
        assert_ne!(a, b, "a fresh IV per message");
        assert!(!a.windows(4).any(|w| w == b"4111"));
        let v: serde_json::Value = serde_json::from_slice(&a).expect("the envelope is JSON");
        assert_eq!(
            STANDARD.decode(v["iv"].as_str().unwrap()).unwrap().len(),
            16
        );
        assert_eq!(c.open(&a), Opened::Plain(plain.to_vec()));
        assert_eq!(c.open(plain), Opened::NotSealed);
        assert_eq!(c.open(b"\"authTag\""), Opened::NotSealed);
    }

    #[test]
    fn another_key_or_a_changed_byte_cannot_open_it() {
        let c = Aes256Gcm::from_hex(KEY).expect("key");
        let other = Aes256Gcm::from_hex(&KEY.replace('0', "1")).expect("key");
        let a = c.seal(b"{\"x\":1}").expect("sealed");
        assert_eq!(other.open(&a), Opened::Undecryptable);
        assert_eq!(NoKey.open(&a), Opened::Undecryptable);
        assert_eq!(NoKey.open(b"{\"x\":1}"), Opened::NotSealed);
        let mut v: serde_json::Value = serde_json::from_slice(&a).unwrap();
        let mut ct = STANDARD.decode(v["encrypted"].as_str().unwrap()).unwrap();
        ct[0] ^= 1;
        v["encrypted"] = STANDARD.encode(ct).into();
        assert_eq!(c.open(v.to_string().as_bytes()), Opened::Undecryptable);
    }

    #[test]
    fn keys_of_the_wrong_shape_are_refused_without_echoing_them() {
        for bad in [
            "",
            "abc",
            &KEY[..62],
            &format!("{}zz", &KEY[..62]),
            &format!("{KEY}00"),
        ] {
            let e = Aes256Gcm::from_hex(bad).expect_err("refused");
            assert!(!e.to_string().contains("0011"), "{e}");
        }
    }

    #[test]
    fn queen_2x_envelopes_open_here() {
        // An envelope made by hand the 2.x way: 16 random IV bytes, the first 12 as the nonce.
        let c = Aes256Gcm::from_hex(KEY).expect("key");
        let iv = [7u8; 16];
        let mut buf = b"{\"hello\":\"world\"}".to_vec();
        let tag = c
            .key
            .seal_in_place_separate_tag(nonce(&iv), Aad::empty(), &mut buf)
            .unwrap();
        let env = serde_json::json!({"encrypted": STANDARD.encode(&buf), "iv": STANDARD.encode(iv), "authTag": STANDARD.encode(tag.as_ref())});
        assert_eq!(
            c.open(env.to_string().as_bytes()),
            Opened::Plain(b"{\"hello\":\"world\"}".to_vec())
        );
    }
}
