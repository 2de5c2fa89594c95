//! JSON text kept as the client wrote it.
//!
//! A payload or a KV value is the producer's own text, byte for byte: `42.00` stays `42.00`,
//! `123456789012345678901234567890` keeps every digit, `1e400` is accepted, keys keep their order
//! and whitespace inside the value is kept. So request bodies that carry such text are read as
//! objects whose fields stay raw (`&RawValue`) until a parser asks for one, and only the small
//! known fields (names, ids, flags, integers) are ever turned into a `serde_json::Value`.
//! Answers embed stored text through [`StoredJson`], which writes it verbatim.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::api::ApiError;

/// `at.key`, or `key` alone at the top of a body.
pub(crate) fn path(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

/// A JSON object whose field values are still the client's text (the last of duplicate keys
/// wins, as with a parsed value).
pub(crate) struct RawObject<'a> {
    fields: BTreeMap<String, &'a RawValue>,
}

impl<'a> RawObject<'a> {
    /// A request body as an object; an empty body is an empty object when `empty_ok`.
    pub(crate) fn body(body: &'a [u8], empty_ok: bool) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            if empty_ok {
                return Ok(Self {
                    fields: BTreeMap::new(),
                });
            }
            return Err(ApiError::bad_request(
                "body",
                "must be a JSON object, got nothing",
            ));
        }
        let raw: &RawValue = serde_json::from_slice(body)
            .map_err(|e| ApiError::new(400, "bad_json", format!("body is not valid JSON: {e}")))?;
        if !raw.get().starts_with('{') {
            return Err(ApiError::bad_request("body", "must be a JSON object"));
        }
        Self::of(raw, "body")
    }

    /// A nested value as an object; `field` names it in the refusal.
    pub(crate) fn of(raw: &'a RawValue, field: &str) -> Result<Self, ApiError> {
        if !raw.get().starts_with('{') {
            return Err(ApiError::bad_request(field, "must be an object"));
        }
        let fields = serde_json::from_str(raw.get()).map_err(|e| {
            ApiError::new(400, "bad_json", format!("{field} is not valid JSON: {e}"))
        })?;
        Ok(Self { fields })
    }

    /// A field's text as written (`null` included); `None` when absent.
    pub(crate) fn raw(&self, key: &str) -> Option<&'a RawValue> {
        self.fields.get(key).copied()
    }

    /// A field's text unless it is absent or `null`.
    pub(crate) fn present(&self, key: &str) -> Option<&'a RawValue> {
        self.raw(key).filter(|r| r.get() != "null")
    }

    /// The known small fields as parsed values, for the ordinary field readers. Other fields
    /// are never parsed (an unknown field holding `1e400` is ignored). `at` prefixes the field
    /// named in a refusal.
    pub(crate) fn values(&self, known: &[&str], at: &str) -> Result<Map<String, Value>, ApiError> {
        let mut out = Map::new();
        for key in known {
            if let Some(raw) = self.raw(key) {
                let v = serde_json::from_str(raw.get()).map_err(|_| {
                    ApiError::bad_request(&path(at, key), "holds a number out of range")
                })?;
                out.insert((*key).to_owned(), v);
            }
        }
        Ok(out)
    }

    /// A list field as its elements' text: `None` when absent or `null`, refused when not a
    /// list or longer than `max`.
    pub(crate) fn list(
        &self,
        key: &str,
        field: &str,
        max: usize,
    ) -> Result<Option<Vec<&'a RawValue>>, ApiError> {
        let Some(raw) = self.present(key) else {
            return Ok(None);
        };
        if !raw.get().starts_with('[') {
            return Err(ApiError::bad_request(field, "must be a list"));
        }
        let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|e| {
            ApiError::new(400, "bad_json", format!("{field} is not valid JSON: {e}"))
        })?;
        if items.len() > max {
            return Err(ApiError::bad_request(
                field,
                &format!("must have at most {max} entries"),
            ));
        }
        Ok(Some(items))
    }
}

/// The fields named in `N` known keys of one JSON object, as written (the last of duplicate
/// keys wins), in the order of the keys; every other field is skipped without being parsed into
/// a value. Read in the same pass as the text around it, without a map per object.
pub(crate) type Picked<'a, const N: usize> = [Option<&'a RawValue>; N];

/// How the fields nobody picked are read: skipped unparsed (`Lax`: a push body, whose unknown
/// fields are never values), or parsed as values and thrown away (`Strict`: a body the slow way
/// reads whole as a value, which refuses a number no value holds, such as `1e400`, anywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// Skip without parsing numbers.
    Lax,
    /// Parse as a value (and refuse what a value cannot hold).
    Strict,
}

fn skip_value<'de, A: serde::de::MapAccess<'de>>(
    map: &mut A,
    unknown: Unknown,
) -> Result<(), A::Error> {
    match unknown {
        Unknown::Lax => map.next_value::<serde::de::IgnoredAny>().map(drop),
        Unknown::Strict => map.next_value::<Value>().map(drop),
    }
}

/// Reads one object into [`Picked`] fields; anything but an object is an error, which callers
/// answer by reading the text again the slow way, which names what is wrong.
pub(crate) struct PickSeed<'k, const N: usize>(pub(crate) &'k [&'k str; N], pub(crate) Unknown);

impl<'de, const N: usize> serde::de::DeserializeSeed<'de> for PickSeed<'_, N> {
    type Value = Picked<'de, N>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, const N: usize> serde::de::Visitor<'de> for PickSeed<'_, N> {
    type Value = Picked<'de, N>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = [None; N];
        while let Some(key) = map.next_key_seed(KeyIndex(self.0))? {
            match key {
                Some(i) => out[i] = Some(map.next_value::<&'de RawValue>()?),
                None => skip_value(&mut map, self.1)?,
            }
        }
        Ok(out)
    }
}

/// A list of objects read with [`PickSeed`] in one pass; at most `max` (more is an error).
#[derive(Clone, Copy)]
pub(crate) struct PickListSeed<'k, const N: usize> {
    /// The keys to pick from each object.
    pub(crate) keys: &'k [&'k str; N],
    /// Most objects accepted.
    pub(crate) max: usize,
    /// How the objects' other fields are read.
    pub(crate) unknown: Unknown,
}

impl<'de, const N: usize> serde::de::DeserializeSeed<'de> for PickListSeed<'_, N> {
    type Value = Vec<Picked<'de, N>>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, const N: usize> serde::de::Visitor<'de> for PickListSeed<'_, N> {
    type Value = Vec<Picked<'de, N>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of objects")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.max));
        while let Some(item) = seq.next_element_seed(PickSeed(self.keys, self.unknown))? {
            if out.len() == self.max {
                return Err(serde::de::Error::custom("too many entries"));
            }
            out.push(item);
        }
        Ok(out)
    }
}

/// What [`pick_list`] read: the top object's picked fields, and its list's objects.
pub(crate) type PickedList<'a, const M: usize, const N: usize> =
    (Picked<'a, M>, Vec<Picked<'a, N>>);

/// A body `{"<key>": [objects...], ...}`: the fields `top` of the body's object as written, and
/// the list's objects with their fields `keys`, in one pass over the text; `None` when the body
/// is anything else (not JSON, the key absent or `null`, not a list, an entry not an object,
/// more than `max` entries, and with `Unknown::Strict` a field nobody picked that is not a
/// value), for the caller to read again the slow way and name what is wrong.
pub(crate) fn pick_list<'a, const M: usize, const N: usize>(
    body: &'a [u8],
    key: &str,
    top: &[&str; M],
    keys: &[&str; N],
    max: usize,
    unknown: Unknown,
) -> Option<PickedList<'a, M, N>> {
    struct Top<'k, const M: usize, const N: usize> {
        key: &'k str,
        top: &'k [&'k str; M],
        list: PickListSeed<'k, N>,
    }
    impl<'de, const M: usize, const N: usize> serde::de::DeserializeSeed<'de> for Top<'_, M, N> {
        type Value = Option<PickedList<'de, M, N>>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, const M: usize, const N: usize> serde::de::Visitor<'de> for Top<'_, M, N> {
        type Value = Option<PickedList<'de, M, N>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut list = None;
            let mut fields = [None; M];
            // The list's key is index 0, the top fields follow.
            let mut names = vec![self.key];
            names.extend_from_slice(self.top);
            while let Some(k) = map.next_key_seed(KeyIndex(&names))? {
                match k {
                    // The last of duplicate keys wins.
                    Some(0) => list = Some(map.next_value_seed(self.list)?),
                    Some(i) => fields[i - 1] = Some(map.next_value::<&'de RawValue>()?),
                    None => skip_value(&mut map, self.list.unknown)?,
                }
            }
            Ok(list.map(|l| (fields, l)))
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = Top {
        key,
        top,
        list: PickListSeed { keys, max, unknown },
    };
    let out = serde::de::DeserializeSeed::deserialize(seed, &mut de).ok()?;
    de.end().ok()?;
    out
}

/// Which known key a field's name is (`None`: not one of them), read without allocating when
/// the name has no escapes.
struct KeyIndex<'k>(&'k [&'k str]);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

/// A number as the client wrote it: an integer literal (no `.`, `e` or `E`) or a fraction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RawNumber {
    /// An integer literal inside i64.
    Int(i64),
    /// A literal with a fraction or an exponent, finite as a 64-bit float.
    Float(f64),
}

/// Read a JSON number from its text without rounding an integer: an integer literal must fit
/// in i64, any other number must be finite as a 64-bit float.
pub(crate) fn number(raw: &RawValue, field: &str) -> Result<RawNumber, ApiError> {
    let t = raw.get();
    if !t.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Err(ApiError::bad_request(field, "must be a number"));
    }
    if !t.contains(['.', 'e', 'E']) {
        return t.parse::<i64>().map(RawNumber::Int).map_err(|_| {
            ApiError::bad_request(
                field,
                "must be an integer from -9223372036854775808 to 9223372036854775807",
            )
        });
    }
    match t.parse::<f64>() {
        Ok(f) if f.is_finite() => Ok(RawNumber::Float(f)),
        _ => Err(ApiError::bad_request(
            field,
            "must be a finite number (at most about 1.8e308 in magnitude)",
        )),
    }
}

/// Stored JSON text (a payload, a KV value) written into an answer verbatim. Bytes that are not
/// JSON (no build stores such bytes) are answered as a JSON string of their lossy UTF-8 text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredJson<'a>(pub(crate) &'a [u8]);

impl Serialize for StoredJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_slice::<&RawValue>(self.0) {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_str(&String::from_utf8_lossy(self.0)),
        }
    }
}

/// Payloads a probe found re-encoded: each must be stored and answered exactly as written.
#[cfg(test)]
pub(crate) const ODD_PAYLOADS: &[&str] = &[
    "123456789012345678901234567890",
    "42.00",
    "-0",
    "18446744073709551616",
    "1e400",
    "{ \"z\" : 1 ,\n\t\"a\":[ 1.10, -0.0e-0 ] , \"m\" : {\"y\":null,\"b\":true} }",
    r#""caf\u00e9 \ud83d\ude00 \"q\" \/""#,
    r#"{"\u0041":"\u00e9"}"#,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(t: &str) -> Box<RawValue> {
        RawValue::from_string(t.to_owned()).unwrap()
    }

    #[test]
    fn stored_text_is_written_verbatim_or_as_a_string() {
        for t in [
            "123456789012345678901234567890",
            "42.00",
            "-0",
            "18446744073709551616",
            "1e400",
            "{ \"b\" :1,\n \"a\":[ 2 ,3] }",
            r#""caf\u00e9 \ud83d\ude00""#,
        ] {
            assert_eq!(serde_json::to_string(&StoredJson(t.as_bytes())).unwrap(), t);
        }
        assert_eq!(
            serde_json::to_string(&StoredJson(b"not json")).unwrap(),
            r#""not json""#
        );
        assert_eq!(
            serde_json::to_string(&StoredJson(b"\xff{")).unwrap(),
            "\"\u{fffd}{\""
        );
        assert_eq!(serde_json::to_string(&StoredJson(b"")).unwrap(), r#""""#);
    }

    #[test]
    fn objects_keep_raw_fields_and_parse_only_known_ones() {
        let body = br#"{"a": 1e400, "q": "x", "n": 7, "l": [1, 2.50]}"#;
        let o = RawObject::body(body, false).unwrap();
        assert_eq!(o.raw("a").unwrap().get(), "1e400");
        let v = o.values(&["q", "n", "missing"], "items[0]").unwrap();
        assert_eq!(v.get("q").and_then(Value::as_str), Some("x"));
        assert_eq!(v.len(), 2);
        assert_eq!(
            o.values(&["a"], "items[0]").unwrap_err().message,
            "items[0].a holds a number out of range"
        );
        let l = o.list("l", "l", 10).unwrap().unwrap();
        assert_eq!(l[1].get(), "2.50");
        assert_eq!(
            o.list("l", "x.l", 1).unwrap_err().message,
            "x.l must have at most 1 entries"
        );
        assert_eq!(o.list("q", "q", 1).unwrap_err().message, "q must be a list");
        assert_eq!(
            RawObject::body(b"[1]", false).err().unwrap().message,
            "body must be a JSON object"
        );
        assert_eq!(RawObject::body(b"{", false).err().unwrap().code, "bad_json");
        assert!(RawObject::body(b"  ", true).is_ok());
    }

    #[test]
    fn numbers_are_read_without_rounding() {
        assert_eq!(
            number(&raw("9007199254740993"), "d").unwrap(),
            RawNumber::Int(9_007_199_254_740_993)
        );
        assert_eq!(number(&raw("-0"), "d").unwrap(), RawNumber::Int(0));
        assert_eq!(number(&raw("1.5"), "d").unwrap(), RawNumber::Float(1.5));
        assert!(
            number(&raw("9223372036854775808"), "d")
                .unwrap_err()
                .message
                .starts_with("d must be an integer from")
        );
        assert!(
            number(&raw("1e400"), "d")
                .unwrap_err()
                .message
                .starts_with("d must be a finite number")
        );
        assert_eq!(
            number(&raw("\"1\""), "d").unwrap_err().message,
            "d must be a number"
        );
    }
}
