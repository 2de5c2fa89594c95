//! The stored form of a name under a tenant's scope, `\u{1}<tenant id>\u{1}<name>`, and how
//! to read it back. Below both of its readers: `names.rs` accepts a stored name by its local
//! part, and `tenant.rs` writes scopes and answers whose a name is.

/// The byte that opens and closes a scope.
pub const SCOPE_MARK: char = '\u{1}';

/// The bytes of a scope: the two marks and the 36 characters of the id.
const SCOPE_LEN: usize = 38;

/// Whether `text` is a UUID in its hyphenated form.
pub(crate) fn is_uuid(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `(id, rest)` of a well-formed scoped name.
pub(crate) fn scoped_parts(stored: &str) -> Option<(&str, &str)> {
    let rest = stored.strip_prefix(SCOPE_MARK)?;
    let id = rest.get(..36)?;
    let local = rest.get(36..)?.strip_prefix(SCOPE_MARK)?;
    (is_uuid(id) && stored.len() >= SCOPE_LEN).then_some((id, local))
}
