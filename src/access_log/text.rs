//! A record's target: short text kept inline, so the common case (`host:port`, an
//! address and port) costs a request no allocation; longer text goes to the heap.

use std::fmt;

/// Bytes kept inline: any IPv4 `address:port`, most `host:port` names.
const INLINE: usize = 40;

/// Text, inline up to [`INLINE`] bytes. Held as `str` either way, so reading it
/// checks no UTF-8 (a check on each read cost a forwarded request about 300
/// instructions).
#[derive(Clone)]
pub struct Text(Repr);

#[derive(Clone)]
enum Repr {
    Inline(arrayvec::ArrayString<INLINE>),
    Heap(String),
}

impl Default for Text {
    fn default() -> Self {
        Text(Repr::Inline(arrayvec::ArrayString::new()))
    }
}

impl Text {
    /// `value` as its `Display` writes it.
    pub fn display(value: &impl fmt::Display) -> Text {
        let mut t = Text::default();
        let _ = fmt::Write::write_fmt(&mut t, format_args!("{value}"));
        t
    }

    /// What `write` writes into it: for a writer that knows the type it writes to
    /// (`Target::write_to`), cheaper than [`Text::display`]'s formatting machinery.
    pub fn written(write: impl FnOnce(&mut Text) -> fmt::Result) -> Text {
        let mut t = Text::default();
        let _ = write(&mut t);
        t
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline(a) => a.as_str(),
            Repr::Heap(h) => h.as_str(),
        }
    }

    /// Whether it is held on the heap (longer than [`INLINE`] bytes).
    #[cfg(test)]
    fn spilled(&self) -> bool {
        matches!(self.0, Repr::Heap(_))
    }
}

impl fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        match &mut self.0 {
            Repr::Inline(a) => {
                if a.try_push_str(s).is_err() {
                    let mut h = String::with_capacity(a.len() + s.len());
                    h.push_str(a);
                    h.push_str(s);
                    self.0 = Repr::Heap(h);
                }
            }
            Repr::Heap(h) => h.push_str(s),
        }
        Ok(())
    }

    fn write_char(&mut self, c: char) -> fmt::Result {
        if let Repr::Inline(a) = &mut self.0
            && a.try_push(c).is_ok()
        {
            return Ok(());
        }
        self.write_str(c.encode_utf8(&mut [0; 4]))
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        match arrayvec::ArrayString::from(s) {
            Ok(a) => Text(Repr::Inline(a)),
            Err(_) => Text(Repr::Heap(s.to_string())),
        }
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        if s.len() <= INLINE { Text::from(s.as_str()) } else { Text(Repr::Heap(s)) }
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
        assert!(!t.spilled(), "an IPv4 address and port needs no allocation");
        assert!(Text::from(long_name().as_str()).spilled());
        let long = "a".repeat(300) + ".example.com:443";
        let t = Text::from(long.clone());
        assert_eq!(t.as_str(), long);
        assert_eq!(Text::display(&long).as_str(), long);
        assert_eq!(format!("{t}"), long);
        assert!(Text::default().is_empty());
        // Text that grows past the inline bytes moves to the heap whole.
        let mut t = Text::from("a".repeat(INLINE - 1).as_str());
        fmt::Write::write_str(&mut t, "bc").unwrap();
        assert!(t.spilled());
        assert_eq!(t.as_str(), format!("{}bc", "a".repeat(INLINE - 1)));
        assert_eq!(Text::from(t.as_str()), t);
    }

    fn long_name() -> String {
        "b".repeat(INLINE + 1)
    }
}
