//! Decimal text for integers, IPv4 addresses, socket addresses and log timestamps,
//! written without `core::fmt`'s argument machinery. The access log writes several of
//! them for every request and tunnel; the output is byte for byte what `Display`
//! (and `humantime`'s RFC 3339) gives.

use std::cell::RefCell;
use std::fmt::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

/// `v` in decimal.
pub fn u64(w: &mut (impl Write + ?Sized), v: u64) -> fmt::Result {
    w.write_str(itoa::Buffer::new().format(v))
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display` writes it.
pub fn ipv4(w: &mut (impl Write + ?Sized), a: Ipv4Addr) -> fmt::Result {
    let [a, b, c, d] = a.octets();
    let mut buf = itoa::Buffer::new();
    w.write_str(buf.format(a))?;
    for octet in [b, c, d] {
        w.write_char('.')?;
        w.write_str(buf.format(octet))?;
    }
    Ok(())
}

/// `address:port` (`[address]:port` for IPv6), as `SocketAddr`'s `Display` writes it.
pub fn socket_addr(w: &mut (impl Write + ?Sized), a: SocketAddr) -> fmt::Result {
    match a {
        SocketAddr::V4(v4) => {
            ipv4(w, *v4.ip())?;
            w.write_char(':')?;
            w.write_str(itoa::Buffer::new().format(v4.port()))
        }
        // Rare in the log and intricate to abbreviate: the standard library writes it.
        SocketAddr::V6(v6) => write!(w, "{v6}"),
    }
}

thread_local! {
    /// The second last formatted on this thread and its `YYYY-MM-DDTHH:MM:SS`, kept
    /// as text (no UTF-8 check each time it is written).
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// `now` in RFC 3339 with milliseconds in UTC (`2026-12-03T13:07:01.123Z`), as
/// `humantime::format_rfc3339_millis` writes it; the date and time of day are worked
/// out once per second per thread.
pub fn rfc3339_millis(w: &mut (impl Write + ?Sized), now: SystemTime) -> fmt::Result {
    let Ok(since) = now.duration_since(UNIX_EPOCH) else {
        return write!(w, "{}", humantime::format_rfc3339_millis(now));
    };
    let secs = since.as_secs();
    let whole = SECOND.with(|second| {
        let Ok(mut second) = second.try_borrow_mut() else { return Ok(false) };
        if second.0 != secs {
            let mut s = String::with_capacity(24);
            write!(s, "{}", humantime::format_rfc3339_seconds(now))?;
            // `YYYY-MM-DDTHH:MM:SSZ`: anything else (a year past 9999) is written whole.
            if s.len() != 20 {
                return Ok(false);
            }
            s.truncate(19);
            *second = (secs, s);
        }
        w.write_str(&second.1).map(|()| true)
    })?;
    if !whole {
        return write!(w, "{}", humantime::format_rfc3339_millis(now));
    }
    // `.mmmZ`: 1000 + ms has four digits, the first of them a `1` that is not written.
    let mut digits = itoa::Buffer::new();
    let ms = digits.format(1000 + since.subsec_millis());
    w.write_char('.')?;
    w.write_str(ms.get(1..).unwrap_or(ms))?;
    w.write_char('Z')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv6Addr, SocketAddrV6};
    use std::time::Duration;

    fn text(f: impl FnOnce(&mut String) -> fmt::Result) -> String {
        let mut s = String::new();
        f(&mut s).unwrap_or_else(|e| panic!("{e}"));
        s
    }

    #[test]
    fn integers_and_addresses_read_as_display_writes_them() {
        for v in [0, 7, 10, 99, 1000, 65535, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(text(|w| u64(w, v)), v.to_string());
        }
        for a in [Ipv4Addr::new(0, 0, 0, 0), Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(10, 200, 3, 255)] {
            assert_eq!(text(|w| ipv4(w, a)), a.to_string());
        }
        // Every octet value in every place, and every port.
        for v in 0..=255u8 {
            for a in [[v, 0, 9, 255], [1, v, 99, 0], [100, 10, v, 1], [255, 255, 255, v]] {
                assert_eq!(text(|w| ipv4(w, Ipv4Addr::from(a))), Ipv4Addr::from(a).to_string());
            }
        }
        for port in 0..=u16::MAX {
            let a = SocketAddr::from(([255, 255, 255, 255], port));
            assert_eq!(text(|w| socket_addr(w, a)), a.to_string());
        }
        let addrs = [
            SocketAddr::from(([127, 0, 0, 1], 4002)),
            SocketAddr::from(([255, 255, 255, 255], 0)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, 443)),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap_or(Ipv6Addr::LOCALHOST), 80, 0, 3)),
        ];
        for a in addrs {
            assert_eq!(text(|w| socket_addr(w, a)), a.to_string());
        }
    }

    #[test]
    fn timestamps_read_as_humantime_writes_them_across_seconds() {
        // Within one second, across a second, a minute, a day and a year, and back.
        let base = UNIX_EPOCH + Duration::from_secs(1_798_761_599); // 2026-12-31T23:59:59Z
        let offsets_ms = [0, 1, 999, 1000, 1001, 61_000, 86_400_000, 0, 123, 59_999];
        for ms in offsets_ms {
            let t = base + Duration::from_millis(ms);
            assert_eq!(text(|w| rfc3339_millis(w, t)), humantime::format_rfc3339_millis(t).to_string(), "{ms}");
        }
        let now = SystemTime::now();
        assert_eq!(text(|w| rfc3339_millis(w, now)), humantime::format_rfc3339_millis(now).to_string());
    }
}
