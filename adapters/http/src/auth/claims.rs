//! A token's claims read as JSON that has no duplicate key at any depth. `serde_json` keeps the
//! last of two equal keys, so `{"role":"read-only","role":"admin"}` would read as admin while
//! another reader of the same token (a gateway, an audit log) may see read-only: a token whose
//! claims two readers can read differently is refused (401 `bad_claims`).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// The most nested arrays and objects a payload may have (serde_json's own recursion limit is
/// 128; a token needs a handful).
const MAX_DEPTH: usize = 32;

/// Claims that parsed with every object's keys distinct.
#[derive(Debug)]
pub(super) struct Claims(pub(super) Value);

impl<'de> Deserialize<'de> for Claims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Distinct { depth: 0 }).map(Claims)
    }
}

/// Builds a [`Value`], refusing an object that repeats a key.
#[derive(Clone, Copy)]
struct Distinct {
    depth: usize,
}

impl<'de> de::DeserializeSeed<'de> for Distinct {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Distinct {
    fn deeper<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom("the claims nest too deep"));
        }
        Ok(Self {
            depth: self.depth + 1,
        })
    }
}

impl<'de> Visitor<'de> for Distinct {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON without duplicate keys")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.deeper()?;
        let mut seen = HashSet::new();
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                // The key itself is the token's data: not repeated in the error.
                return Err(de::Error::custom("a claim key appears twice in one object"));
            }
            let v = map.next_value_seed(inner)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Value, String> {
        serde_json::from_str::<Claims>(text)
            .map(|c| c.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_repeated_key_at_any_depth_is_refused() {
        assert!(read(r#"{"role":"read-only","role":"admin"}"#).is_err());
        assert!(read(r#"{"realm":{"roles":["a"],"roles":["admin"]}}"#).is_err());
        assert!(read(r#"{"a":[{"x":1,"x":2}]}"#).is_err());
        let ok = read(r#"{"role":"admin","realm":{"role":"x"},"n":[1,2.5,-3,null,true]}"#)
            .expect("distinct keys");
        assert_eq!(ok["realm"]["role"], "x");
        assert_eq!(ok["n"][1], 2.5);
        let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
        assert!(read(&deep).is_err());
    }
}
