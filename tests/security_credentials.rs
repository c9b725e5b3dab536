//! Security regressions, attack class: credentials. Missing and wrong tokens, one
//! sandbox's token used for another's hosts or identity, and secrets leaking into
//! error bodies or logs. (Signed-token forms: tests/tokens.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::time::Duration;

use support::raw;
use support::{TOKEN_A, TOKEN_B, basic, curl, curl_via, start_http, start_tls};

#[test]
fn credentials_are_required_and_checked() {
    let (gw, origin, ca) = start_tls();
    let url = format!("https://tls.test:{}/", origin.port());
    let out = curl(&["--cacert", ca.ca_pem_path.to_str().unwrap(), "-x", &gw.addr.to_string(), &url]);
    assert_eq!(out.connect_status, 407, "{out:?}");
    let out = curl_via(&gw, &ca, "sbx-a", "wrong-token", &url);
    assert_eq!(out.connect_status, 407, "{out:?}");
    let out = curl_via(&gw, &ca, "nobody", TOKEN_A, &url);
    assert_eq!(out.connect_status, 407, "{out:?}");

    let req = format!("CONNECT tls.test:{} HTTP/1.1\r\n\r\n", origin.port());
    let resp = support::raw::request(gw.addr, &req);
    assert!(
        resp.contains("Proxy-Authenticate: Basic realm=\"egress-gateway\"")
            || resp.to_ascii_lowercase().contains("proxy-authenticate: basic realm=\"egress-gateway\""),
        "{resp}"
    );
    assert!(resp.contains("auth_required"), "{resp}");
    let log = gw.log_text();
    assert!(!log.contains("wrong-token") && !log.contains(TOKEN_A));

    // Credentials of another scheme are told so (curl --proxy-ntlm, a Bearer token),
    // on both entries, without echoing what followed the scheme.
    for (value, scheme) in [("NTLM TlRMTVNTUAABAAAAB4IIogAAAAA=", "NTLM"), ("Bearer sbx-a:wrong-token", "Bearer")] {
        for head in [
            format!("CONNECT tls.test:{} HTTP/1.1\r\nProxy-Authorization: {value}\r\n\r\n", origin.port()),
            format!("GET http://origin.test/ HTTP/1.1\r\nProxy-Authorization: {value}\r\n\r\n"),
        ] {
            let resp = support::raw::request(gw.addr, &head);
            assert!(resp.starts_with("HTTP/1.1 407"), "{resp}");
            assert!(resp.contains(&format!("{scheme} scheme; the gateway takes Basic only")), "{resp}");
            assert!(resp.contains("auth_invalid") && !resp.contains("wrong-token"), "{resp}");
        }
    }
}

#[test]
fn one_sandboxs_token_does_not_open_another_sandboxs_hosts() {
    let (gw, origin, ca) = start_tls();
    // sbx-b's own token, sbx-a's host.
    let out = curl_via(&gw, &ca, "sbx-b", TOKEN_B, &format!("https://tls.test:{}/", origin.port()));
    assert_eq!(out.connect_status, 403, "{out:?}");
    // sbx-b's token presented as sbx-a.
    let out = curl_via(&gw, &ca, "sbx-a", TOKEN_B, &format!("https://tls.test:{}/", origin.port()));
    assert_eq!(out.connect_status, 407, "{out:?}");
    let rec = gw.access_for(&format!("tls.test:{}", origin.port()));
    assert_eq!(rec["sandbox"], "sbx-b");
    assert_eq!(rec["reason"], "host_not_allowed");
}

#[test]
fn secrets_never_appear_in_error_bodies_or_logs() {
    let (gw, origin) = start_http();
    let port = origin.port();
    // Denied, malformed and upstream-failure answers.
    let requests = [
        format!("GET http://example.com:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!("GET http://origin.test:1/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!("CONNECT bad host:1 HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A)),
        format!(
            "GET http://origin.test:{port}/ HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
            basic("sbx-a", "guess-1234")
        ),
    ];
    for r in &requests {
        let resp = raw::exchange(gw.addr, r.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1).as_bytes());
        assert!(!resp.contains(TOKEN_A) && !resp.contains("guess-1234"), "{resp}");
    }
    std::thread::sleep(Duration::from_millis(200));
    let log = gw.log_text();
    assert!(!log.contains(TOKEN_A) && !log.contains("guess-1234"));
    assert!(!log.contains(&basic("sbx-a", TOKEN_A)[6..]), "not even base64-encoded");
}

/// Clients put credentials in URLs too: userinfo (`http://ID:TOKEN@host/`) and query
/// strings. Neither reaches the access log or an error body when the request is
/// refused before its target parsed.
#[test]
fn credentials_in_urls_are_not_logged() {
    let (gw, origin) = start_http();
    let port = origin.port();
    let requests = [
        format!("GET http://sbx-a:{TOKEN_A}@origin.test:{port}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
        format!("GET /?key=sbx-a:{TOKEN_A} HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
        format!("GET https://origin.test:{port}/x?token={TOKEN_A} HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
        format!("CONNECT sbx-a:{TOKEN_A}@origin.test:{port} HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
    ];
    for r in &requests {
        let resp = raw::exchange(gw.addr, r.replacen("\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1).as_bytes());
        assert!(raw::status(&resp) >= 400, "{resp}");
        assert!(!resp.contains(TOKEN_A), "{resp}");
    }
    let refused = gw.wait_for_access(requests.len(), |v| v["status"].as_u64().is_some_and(|s| s >= 400));
    assert!(refused.iter().any(|v| v["target"].as_str().is_some_and(|t| t.contains("[redacted]"))), "{refused:?}");
    let log = gw.log_text();
    assert!(!log.contains(TOKEN_A), "{log}");
}
