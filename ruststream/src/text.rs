//! [`Text`]: a cheaply clonable UTF-8 string for subjects, keys and header values.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use bytes::{Bytes, BytesMut};

/// An immutable UTF-8 string backed by [`Bytes`].
///
/// Subjects, keys, reply subjects, correlation ids and header values travel with
/// every delivery; `Text` makes copying them a reference-count increment (or
/// nothing at all for `&'static str`), so a fan-out or a context clone never
/// allocates.
///
/// ```
/// use ruststream::Text;
///
/// let a = Text::from_static("orders.created");
/// let b = a.clone();
/// assert_eq!(&*b, "orders.created");
/// assert_eq!(Text::from(String::from("x")), "x");
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Text(Bytes);

impl Text {
    /// Wraps a static string without allocating.
    pub const fn from_static(s: &'static str) -> Self {
        Text(Bytes::from_static(s.as_bytes()))
    }

    /// The string slice.
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor starts from a `str` and the bytes are never
        // mutated, so they are valid UTF-8. Checking again on every access would
        // put a UTF-8 scan on the per-message path.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }

    /// The underlying bytes.
    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

/// Short texts cut from one shared buffer: one allocation per
/// [`ARENA_CHUNK`] bytes of text rather than one per text. A text keeps its
/// whole chunk alive, so only texts that live about as long as each other
/// belong here (the reply subjects of requests in flight).
#[derive(Default)]
pub(crate) struct TextArena {
    chunk: BytesMut,
}

/// Bytes of one [`TextArena`] chunk.
const ARENA_CHUNK: usize = 4096;

impl TextArena {
    /// The concatenation of `parts`, cut from the current chunk (or a new
    /// one when it is full); a text that could take more than an eighth of
    /// a chunk takes the ordinary way.
    pub(crate) fn concat(&mut self, parts: &[Part<'_>]) -> Text {
        // Room for every number at its widest: written straight into the
        // chunk, with no copy on the way.
        let most: usize = parts.iter().map(Part::most).sum();
        if most > ARENA_CHUNK / 8 {
            return Text::from(Part::concat(parts));
        }
        if self.chunk.capacity() < most {
            self.chunk = BytesMut::with_capacity(ARENA_CHUNK);
        }
        let mut digits = [0; 20];
        for part in parts {
            self.chunk.extend_from_slice(match part {
                Part::Str(s) => s.as_bytes(),
                Part::Decimal(n) => decimal(*n, &mut digits),
                Part::Hex(n) => hex(*n, &mut digits),
            });
        }
        // Whole `str`s and ASCII digits: valid UTF-8.
        Text(self.chunk.split().freeze())
    }
}

/// A piece of [`TextArena::concat`].
#[derive(Clone, Copy)]
pub(crate) enum Part<'a> {
    Str(&'a str),
    /// A number, in decimal.
    Decimal(u64),
    /// A number, in lowercase hexadecimal.
    Hex(u64),
}

impl Part<'_> {
    /// The most bytes this part can take.
    fn most(&self) -> usize {
        match self {
            Part::Str(s) => s.len(),
            Part::Decimal(_) | Part::Hex(_) => 20,
        }
    }

    fn concat(parts: &[Part<'_>]) -> String {
        use std::fmt::Write;
        let mut text = String::new();
        for part in parts {
            // Writing into a `String` cannot fail.
            let _ = match part {
                Part::Str(s) => text.write_str(s),
                Part::Decimal(n) => write!(text, "{n}"),
                Part::Hex(n) => write!(text, "{n:x}"),
            };
        }
        text
    }
}

/// `n`'s decimal digits, written at the end of `buf` (without `fmt`'s
/// machinery, which costs more than the digits on a per-request path).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// `n`'s lowercase hexadecimal digits, written at the end of `buf`.
fn hex(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = DIGITS[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[at..];
        }
    }
}

// Hash as `str` does, so `HashMap<Text, _>` can be queried with `&str`
// (required by the `Borrow<str>` contract).
impl Hash for Text {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Text(Bytes::from(s))
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Self {
        Text::from(s.as_str())
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last segment of a Rust path: `orders::confirm` → `confirm`.
pub(crate) fn last_segment(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}

/// Whether `path` (a handler's full name, from its crate down) is what
/// `wanted` names: the whole path or its last segments (`confirm`,
/// `billing::confirm` for `shop::billing::confirm`).
#[cfg_attr(not(any(feature = "config", feature = "testing")), allow(dead_code))]
pub(crate) fn names(path: &str, wanted: &str) -> bool {
    path.strip_suffix(wanted)
        .is_some_and(|before| before.is_empty() || before.ends_with("::"))
}

#[cfg(test)]
mod tests {
    use super::{ARENA_CHUNK, Part, TextArena, names};

    #[test]
    fn a_handler_is_named_by_its_path_or_its_last_segments() {
        let path = "shop::billing::confirm";
        for wanted in [path, "billing::confirm", "confirm"] {
            assert!(names(path, wanted), "{wanted}");
        }
        for wanted in ["firm", "ing::confirm", "", "shop::billing", "x::confirm"] {
            assert!(!names(path, wanted), "{wanted}");
        }
    }

    #[test]
    fn arena_texts_keep_their_contents_across_chunks() {
        let mut arena = TextArena::default();
        let texts: Vec<_> = (0..3 * ARENA_CHUNK as u64 / 8)
            .map(|n| arena.concat(&[Part::Str("_INBOX."), Part::Decimal(n), Part::Hex(n)]))
            .collect();
        for (n, text) in texts.iter().enumerate() {
            assert_eq!(text.as_str(), format!("_INBOX.{n}{n:x}"));
        }
        let long = "x".repeat(ARENA_CHUNK);
        assert_eq!(
            arena.concat(&[Part::Str(&long)]).as_str(),
            long,
            "too long for the arena"
        );
    }
}
