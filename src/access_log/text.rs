//! A record's target: short text kept inline, so the common case (`host:port`, an
//! address and port) costs a request no allocation; longer text goes to the heap.

use std::fmt;

/// Bytes kept inline: any IPv4 `address:port`, most `host:port` names.
const INLINE: usize = 40;

/// UTF-8 text, inline up to [`INLINE`] bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Text(smallvec::SmallVec<[u8; INLINE]>);

impl Text {
    /// `value` as its `Display` writes it.
    pub fn display(value: &impl fmt::Display) -> Text {
        let mut t = Text::default();
        let _ = fmt::Write::write_fmt(&mut t, format_args!("{value}"));
        t
    }

    pub fn as_str(&self) -> &str {
        // Only ever filled from `str`s: never invalid.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(smallvec::SmallVec::from_slice(s.as_bytes()))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        if s.len() <= INLINE { Text::from(s.as_str()) } else { Text(smallvec::SmallVec::from_vec(s.into_bytes())) }
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_inline_and_long_text_is_kept_whole() {
        let addr: std::net::SocketAddr = "255.255.255.255:65535".parse().unwrap();
        let t = Text::display(&addr);
        assert_eq!(t, "255.255.255.255:65535");
        assert!(!t.0.spilled(), "an IPv4 address and port needs no allocation");
        let long = "a".repeat(300) + ".example.com:443";
        let t = Text::from(long.clone());
        assert_eq!(t.as_str(), long);
        assert_eq!(Text::display(&long).as_str(), long);
        assert_eq!(format!("{t}"), long);
        assert!(Text::default().is_empty());
    }
}
