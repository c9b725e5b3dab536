//! Credential-injecting API routes and listener admission, end to end: a local HTTPS
//! upstream (test CA) that records headers and streams server-sent events.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests fail loudly")]

mod support;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use support::raw::{self, status};
use support::tls::TestCa;
use support::{STANDARD_CONFIG, TOKEN_A, TOKEN_B, TestGateway, TestOrigin, basic, curl, standard_policy};

const SECRET: &str = "sk-live-0123456789abcdef";

struct World {
    gw: TestGateway,
    api: TestOrigin,
    secret_file: std::path::PathBuf,
    _ca: TestCa,
    _dir: tempfile::TempDir,
}

fn world(route_extra: &str) -> World {
    world_with(route_extra, "[\"api\"]", "")
}

/// `{PORT}` and `{SECRET}` in `route_extra` are the upstream's port and the secret
/// file; `routes` is policy `a`'s `routes` list.
fn world_with(route_extra: &str, routes: &str, proxy_extra: &str) -> World {
    let ca = TestCa::new(&["api.test"]);
    let api = TestOrigin::https(&ca);
    world_at(ca, api, route_extra, routes, proxy_extra, None)
}

/// [`world_with`] with the route's upstream at `upstream_port` when given (another
/// server than `api`, which then records nothing).
fn world_at(
    ca: TestCa,
    api: TestOrigin,
    route_extra: &str,
    routes: &str,
    proxy_extra: &str,
    upstream_port: Option<u16>,
) -> World {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("api.key");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let hosts = STANDARD_CONFIG
        .replace(
            "\"mixed.test\" = [\"127.0.0.2\", \"127.0.0.1\"]",
            "\"mixed.test\" = [\"127.0.0.2\", \"127.0.0.1\"]\n\"api.test\" = [\"127.0.0.1\"]",
        )
        .replace("[proxy]\n", &format!("[proxy]\n{proxy_extra}\n"));
    // The route's upstream is verified against the test CA (github.ca_file is the extra
    // CA for every upstream the gateway itself calls).
    let config = format!(
        "{hosts}\n[github]\nca_file = \"{ca}\"\n\n[[routes]]\nname = \"api\"\nupstream = \"https://api.test:{port}\"\ninject = {{ header = \"x-api-key\", secret_file = \"{secret}\" }}\n{route_extra}",
        ca = ca.ca_pem_path.display(),
        port = upstream_port.unwrap_or(api.port()),
        secret = secret_file.display(),
    )
    .replace("{PORT}", &api.port().to_string())
    .replace("{SECRET}", &secret_file.display().to_string());
    let policy = standard_policy()
        .replace("deny = [\"blocked.origin.test\"]", &format!("deny = [\"blocked.origin.test\"]\nroutes = {routes}"));
    let gw = TestGateway::start(&config, &policy);
    World { gw, api, secret_file, _ca: ca, _dir: dir }
}

fn header<'a>(r: &'a support::origin::Recorded, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn origin_form_injects_the_key_and_strips_the_sandboxs() {
    let w = world("");
    // Connection: close, so the whole (chunked) body is read.
    let resp = raw::exchange(
        w.gw.addr,
        format!(
            "POST /routes/api/echo?x=1 HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\nx-api-key: forged-by-client\r\nanthropic-version: 2023-06-01\r\nContent-Length: 2\r\n\r\n{{}}"
        )
        .as_bytes(),
    );
    assert_eq!(status(&resp), 200, "{resp}");
    let rec = &w.api.recorded()[0];
    assert_eq!(rec.uri, "/echo?x=1");
    assert_eq!(header(rec, "x-api-key"), Some(SECRET), "the gateway's key replaces the client's");
    assert_eq!(header(rec, "anthropic-version"), Some("2023-06-01"));
    let all = format!("{:?}", rec.headers);
    assert!(
        !all.contains(TOKEN_A) && !all.contains("forged-by-client") && header(rec, "authorization").is_none(),
        "{all}"
    );
    // The upstream echoed the key back: the sandbox sees it redacted.
    assert!(!resp.contains(SECRET), "{resp}");
    assert!(resp.contains("[REDACTED]"), "{resp}");
    // An SDK that sends ID:TOKEN as its API key works too.
    let resp = raw::request(
        w.gw.addr,
        format!("GET /routes/api/echo HTTP/1.1\r\nHost: gw\r\nx-api-key: sbx-a:{TOKEN_A}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&resp), 200, "{resp}");
    assert_eq!(header(&w.api.recorded()[1], "x-api-key"), Some(SECRET));
    assert!(!w.gw.log_text().contains(SECRET) && !w.gw.log_text().contains(TOKEN_A));
}

#[test]
fn a_client_with_http_proxy_set_reaches_the_gateways_own_route_url() {
    // Python requests, git and curl send `http://gateway:4002/routes/...` to the proxy
    // as an absolute-form request: it is the route, not a forward to the gateway.
    // By address, or by a name in proxy.names: never looked up, so a client not yet
    // authenticated cannot make the gateway resolve a name of its choosing.
    let w = world_with("", "[\"api\"]", "names = [\"Gateway.Test\"]");
    let port = w.gw.addr.port();
    for own in [format!("http://{}/routes/api/echo", w.gw.addr), format!("http://gateway.test:{port}/routes/api/echo")]
    {
        let out = curl(&["-x", &w.gw.proxy_url("sbx-a", TOKEN_A), &own]);
        assert_eq!(out.status, 200, "{own}: {out:?}");
        assert_eq!(header(&w.api.recorded().pop().unwrap(), "x-api-key"), Some(SECRET));
    }
    let rec = w.gw.access_for("route:api");
    assert_eq!(rec["decision"], "allow");
    // Without a credential: challenged as a proxy challenges (git sends its proxy
    // credential only after a 407).
    let own = format!("http://{}/routes/api/echo", w.gw.addr);
    let resp = raw::request(w.gw.addr, format!("GET {own} HTTP/1.1\r\nHost: x\r\n\r\n"));
    assert_eq!(status(&resp), 407, "{resp}");
    assert!(resp.starts_with("HTTP/1.1 407 Proxy Authentication Required (auth_required"), "{resp}");
    assert!(resp.to_ascii_lowercase().contains("proxy-authenticate: basic"), "{resp}");
}

#[test]
fn absolute_form_is_upgraded_to_https() {
    let w = world("");
    let out = curl(&["-x", &w.gw.proxy_url("sbx-a", TOKEN_A), &format!("http://api.test:{}/echo", w.api.port())]);
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(header(&w.api.recorded()[0], "x-api-key"), Some(SECRET));
    let rec = w.gw.access_for("route:api");
    assert_eq!(rec["decision"], "allow");
}

#[test]
fn policies_paths_methods_and_budgets() {
    let w = world("paths = [\"/echo\", \"/sse/\"]\nmethods = [\"GET\", \"POST\"]\nsandbox_requests_per_minute = 3\n");
    let get = |path: &str, user: &str, token: &str, method: &str| {
        raw::request(
            w.gw.addr,
            format!(
                "{method} /routes/api{path} HTTP/1.1\r\nHost: gw\r\nAuthorization: {}\r\nContent-Length: 0\r\n\r\n",
                basic(user, token)
            )
            .as_bytes(),
        )
    };
    let resp = get("/echo", "sbx-b", TOKEN_B, "GET");
    assert_eq!(status(&resp), 403, "{resp}");
    assert!(resp.contains("does not list route"), "{resp}");
    assert!(resp.contains("\"reason\":\"route_not_allowed\""), "{resp}");
    let resp = get("/bytes/10", "sbx-a", TOKEN_A, "GET");
    assert_eq!(status(&resp), 403);
    assert!(resp.contains("path /bytes/10 is not allowed"), "{resp}");
    assert!(resp.contains("\"reason\":\"route_not_allowed\""), "{resp}");
    let resp = get("/echo", "sbx-a", TOKEN_A, "DELETE");
    assert_eq!(status(&resp), 403);
    assert!(resp.contains("method DELETE"), "{resp}");
    assert!(resp.contains("\"reason\":\"route_not_allowed\""), "{resp}");
    let refused = w.gw.wait_for_access(3, |v| v["reason"] == "route_not_allowed").len();
    assert_eq!(refused, 3, "every route refusal is logged with its reason");
    let resp = get("/echo/../bytes/1", "sbx-a", TOKEN_A, "GET");
    assert_ne!(status(&resp), 200);
    // Budget: 3 per minute, and 3 of them are left (refusals before the budget do not count).
    for _ in 0..3 {
        assert_eq!(status(&get("/echo", "sbx-a", TOKEN_A, "GET")), 200);
    }
    let resp = get("/echo", "sbx-a", TOKEN_A, "GET");
    assert_eq!(status(&resp), 429, "{resp}");
    assert!(resp.contains("limit_exceeded"));
    let resp = raw::request(w.gw.addr, b"GET /routes/api/echo HTTP/1.1\r\nHost: gw\r\n\r\n");
    assert_eq!(status(&resp), 401, "no credentials: challenge");
    assert_eq!(w.api.recorded().len(), 3);
}

#[test]
fn server_sent_events_stream_as_produced() {
    let w = world("");
    let mut s = raw::connect(w.gw.addr);
    s.write_all(
        format!("GET /routes/api/sse/5/300 HTTP/1.1\r\nHost: gw\r\nAuthorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A))
            .as_bytes(),
    )
    .unwrap();
    let started = Instant::now();
    let head = raw::read_head(&mut s);
    assert_eq!(status(&head), 200, "{head}");
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("data: 4") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let first_event = started.elapsed();
    assert!(first_event < Duration::from_millis(900), "first event after {first_event:?}: buffered?");
}

#[test]
fn secrets_rotate_on_reload() {
    let w = world("");
    let call = || {
        raw::request(
            w.gw.addr,
            format!("GET /routes/api/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: {}\r\n\r\n", basic("sbx-a", TOKEN_A))
                .as_bytes(),
        )
    };
    assert_eq!(status(&call()), 200);
    std::fs::write(&w.secret_file, "sk-live-rotated-9999\n").unwrap();
    w.gw.signal("HUP");
    w.gw.wait_for_log(Duration::from_secs(5), |v| v["msg"] == "policies reloaded");
    assert_eq!(status(&call()), 200);
    let recs = w.api.recorded();
    assert_eq!(header(&recs[0], "x-api-key"), Some(SECRET));
    assert_eq!(header(&recs[1], "x-api-key"), Some("sk-live-rotated-9999"));
}

fn connect_from(source: &str, to: std::net::SocketAddr) -> std::net::TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&format!("{source}:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    sock.connect(&to.into()).unwrap();
    let s: std::net::TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

#[test]
fn clients_outside_allowed_clients_are_closed() {
    let origin = TestOrigin::http();
    let config = STANDARD_CONFIG.replace("[proxy]\n", "[proxy]\nallowed_clients = [\"127.0.0.1/32\"]\n");
    let gw = TestGateway::start(&config, &standard_policy());
    let req = format!(
        "GET http://origin.test:{}/echo HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        origin.port(),
        basic("sbx-a", TOKEN_A)
    );
    let mut outside = connect_from("127.0.0.2", gw.addr);
    let _ = outside.write_all(req.as_bytes());
    let mut b = [0u8; 16];
    assert!(matches!(outside.read(&mut b), Ok(0) | Err(_)), "closed before anything is answered");
    let mut inside = connect_from("127.0.0.1", gw.addr);
    inside.write_all(req.as_bytes()).unwrap();
    assert_eq!(status(&raw::read_response(&mut inside)), 200);
    assert_eq!(origin.recorded().len(), 1);
}

#[test]
fn mutual_tls_with_curl() {
    let origin_ca = TestCa::new(&["tls.test"]);
    let origin = TestOrigin::https(&origin_ca);
    let proxy_ca = TestCa::with_client(&["127.0.0.1"], "sbx-a");
    let other_ca = TestCa::with_client(&["127.0.0.1"], "sbx-a");
    let config = STANDARD_CONFIG.replace(
        "[proxy]\n",
        &format!(
            "[proxy]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_client_ca = \"{}\"\ntls_client_cn_is_sandbox = true\n",
            proxy_ca.cert_pem_path.display(),
            proxy_ca.key_pem_path.display(),
            proxy_ca.ca_pem_path.display()
        ),
    );
    let gw = TestGateway::start(&config, &standard_policy());
    let url = format!("https://tls.test:{}/echo", origin.port());
    let base = |user: &str, token: &str, cert: Option<&TestCa>| {
        let proxy = format!("https://{user}:{token}@127.0.0.1:{}", gw.addr.port());
        let mut args = vec![
            "--proxy".to_string(),
            proxy,
            "--proxy-cacert".into(),
            proxy_ca.ca_pem_path.display().to_string(),
            "--cacert".into(),
            origin_ca.ca_pem_path.display().to_string(),
        ];
        if let Some(c) = cert {
            args.extend(["--proxy-cert".into(), c.client_cert_path.display().to_string()]);
            args.extend(["--proxy-key".into(), c.client_key_path.display().to_string()]);
        }
        args.push(url.clone());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(&refs)
    };
    let out = base("sbx-a", TOKEN_A, Some(&proxy_ca));
    assert_eq!((out.connect_status, out.status), (200, 200), "{out:?}");
    let out = base("sbx-a", TOKEN_A, None);
    assert_ne!(out.exit, 0, "no client certificate: no handshake");
    let out = base("sbx-a", TOKEN_A, Some(&other_ca));
    assert_ne!(out.exit, 0, "a certificate from another CA is refused");
    // The certificate names sbx-a; sbx-r's own token does not go with it.
    let out = base("sbx-r", TOKEN_B, Some(&proxy_ca));
    assert_eq!(out.connect_status, 407, "{out:?}");
}

/// The redactor matches raw bytes, so a compressed echo of the key would slip past it:
/// the gateway asks for `identity`, refuses an answer still encoded, and never forwards
/// `Range` (a key split across two ranges escapes a per-response redactor).
#[test]
fn compressed_or_ranged_echoes_never_leak_the_key() {
    let w = world("");
    let get = |path: &str, extra: &str| {
        raw::exchange(
            w.gw.addr,
            format!(
                "GET /routes/api{path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n{extra}\r\n"
            )
            .as_bytes(),
        )
    };
    // Asked for gzip by the client: the upstream is asked for identity and answers so.
    let resp = get("/gzip-if-asked", "Accept-Encoding: gzip, br\r\nRange: bytes=0-10\r\nIf-Range: x\r\n");
    assert_eq!(status(&resp), 200, "{resp}");
    assert!(!resp.contains(SECRET) && resp.contains("[REDACTED]"), "{resp}");
    let rec = w.api.recorded().into_iter().last().unwrap();
    assert_eq!(header(&rec, "accept-encoding"), Some("identity"));
    assert!(header(&rec, "range").is_none() && header(&rec, "if-range").is_none(), "{:?}", rec.headers);
    // An upstream that compresses anyway: refused, the encoded body never passes.
    let resp = get("/gzip-always", "Accept-Encoding: gzip\r\n");
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("upstream_encoding"), "{resp}");
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    assert!(body.starts_with('{'), "the JSON refusal, not the gzip body: {body:?}");
    w.gw.wait_for_access(1, |v| v["reason"] == "upstream_encoding" && v["status"] == 502);
    // The key in the upstream's reason phrase or in a header name.
    let resp = get("/reason-echo", "");
    assert_eq!(status(&resp), 401, "{resp}");
    assert!(!resp.to_ascii_lowercase().contains(&SECRET.to_ascii_lowercase()), "{resp}");
}

/// What an outside review found: override headers carried another method or path
/// past the route's rules; double-encoded and overlong dots passed the traversal
/// check; with two routes on one host the config's order won over the policy's; an
/// SDK's own `Authorization` hid the API-key credential.
#[test]
fn route_rules_hold_against_overrides_encodings_and_ordering() {
    let open_route = "\n[[routes]]\nname = \"open\"\nupstream = \"https://api.test:{PORT}\"\n\
                      inject = { header = \"x-open-key\", secret_file = \"{SECRET}\" }\n";
    let w = world(&format!("paths = [\"/echo\"]\nmethods = [\"GET\"]\n{open_route}"));
    let get = |path: &str, extra: &str| {
        raw::request(
            w.gw.addr,
            format!(
                "GET /routes/api{path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n{extra}\r\n"
            )
            .as_bytes(),
        )
    };
    let resp = get(
        "/echo",
        "X-HTTP-Method-Override: DELETE\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n\
         Connection: X-Hop\r\nX-Hop: 1\r\nProxy-Status: egress-gateway; error=http_request_denied\r\n",
    );
    assert_eq!(status(&resp), 200, "{resp}");
    let rec = w.api.recorded().pop().unwrap();
    // Nor may a field the client's Connection names, or one only the gateway writes.
    for h in ["x-http-method-override", "x-original-url", "x-rewrite-url", "x-hop", "proxy-status"] {
        assert!(header(&rec, h).is_none(), "{h} reached the upstream: {:?}", rec.headers);
    }
    for path in ["/echo/%252e%252e/admin", "/echo/%c0%ae%c0%ae/admin", "/echo/..%5cadmin", "/echo\\..\\admin"] {
        let resp = get(path, "");
        assert_eq!(status(&resp), 400, "{path}: {resp}");
    }
    // An SDK's own Authorization scheme leaves the API key header to identify it.
    let resp = raw::request(
        w.gw.addr,
        format!("GET /routes/api/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: Token abc\r\nx-api-key: sbx-a:{TOKEN_A}\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(status(&resp), 200, "{resp}");
    assert_eq!(w.api.recorded().len(), 2, "only the two allowed requests reached the upstream");
    drop(w);

    // Two routes on one host: the first the policy lists is the one used.
    let w = world_with(&format!("paths = [\"/echo\"]\n{open_route}"), "[\"open\", \"api\"]", "");
    let out = curl(&["-x", &w.gw.proxy_url("sbx-a", TOKEN_A), &format!("http://api.test:{}/bytes/3", w.api.port())]);
    assert_eq!(out.status, 200, "{out:?}");
    let rec = w.api.recorded().pop().unwrap();
    assert_eq!((header(&rec, "x-open-key"), header(&rec, "x-api-key")), (Some(SECRET), None));
}

/// A route's host can be inspected (CONNECT, then TLS with the gateway's CA): its
/// requests take the route, key and all. A CONNECT inside that connection is refused
/// before any handler: it never goes upstream with the route's key.
#[test]
fn an_inspected_route_host_takes_the_route_and_refuses_a_tunnel_inside() {
    let ca_dir = tempfile::tempdir().unwrap();
    let (cert, key) = (ca_dir.path().join("ca.pem"), ca_dir.path().join("ca.key"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_egress-gateway"))
        .args(["ca", "init", "--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let intercept =
        format!("\n[intercept]\nca_cert_file = \"{}\"\nca_key_file = \"{}\"\n", cert.display(), key.display());
    let w = world_with(&intercept, "[\"api\"]\ninspect = [\"api.test:*\"]", "");
    let url = format!("https://api.test:{}/echo", w.api.port());
    let proxy = w.gw.proxy_url("sbx-a", TOKEN_A);

    let r = curl(&["--cacert", cert.to_str().unwrap(), "-x", &proxy, &url]);
    assert_eq!(r.status, 200, "{} {}", r.body, r.stderr);
    assert_eq!(header(&w.api.recorded()[0], "x-api-key"), Some(SECRET), "the route added its key");
    assert!(!r.body.contains(SECRET), "{}", r.body);

    for version in ["--http1.1", "--http2"] {
        let r = curl(&["--cacert", cert.to_str().unwrap(), "-x", &proxy, version, "-X", "CONNECT", &url]);
        if version == "--http1.1" {
            assert_eq!(r.status, 400, "{} {}", r.body, r.stderr);
            assert!(r.body.contains("CONNECT inside an inspected connection"), "{}", r.body);
        }
        assert_eq!(w.api.recorded().len(), 1, "{version}: nothing more reached the upstream");
    }
}

/// An upstream may echo the key escaped: JSON's `\/`, or percent-encoded in a URL it
/// builds. Those spellings are redacted too; and a header named like the injected one
/// with `_` for `-` (which CGI backends read as the same) stays behind.
#[test]
fn escaped_echoes_of_the_key_are_redacted_and_underscore_names_stripped() {
    let key = "sk-live-AbC/def+ghi=0123456789";
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("api2.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let extra = format!(
        "\n[[routes]]\nname = \"api2\"\nupstream = \"https://api.test:{{PORT}}\"\ninject = {{ header = \"x-api-key\", secret_file = \"{}\" }}\n",
        key_file.display()
    );
    let w = world_with(&extra, "[\"api\", \"api2\"]", "");
    let resp = raw::exchange(
        w.gw.addr,
        format!(
            "GET /routes/api2/escaped-echo HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\nx_api_key: forged-by-client\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(status(&resp), 200, "{resp}");
    let rec = &w.api.recorded()[0];
    assert_eq!(header(rec, "x-api-key"), Some(key), "the route's key went upstream");
    assert!(!format!("{:?}", rec.headers).contains("forged-by-client"), "{:?}", rec.headers);
    for leaked in ["AbC/def", "AbC\\/def", "AbC%2Fdef", "AbC%2fdef", "AbC\\u002fdef", "ABC/DEF"] {
        assert!(!resp.contains(leaked), "{leaked}: {resp}");
    }
    assert_eq!(resp.matches("[REDACTED]").count(), 5, "header, JSON, URL, \\u and upper-case echoes: {resp}");
}

#[test]
fn an_upstream_101_on_a_route_is_a_502_not_a_hang() {
    let w = world("paths = [\"/ws\"]\n");
    let resp = raw::request(
        w.gw.addr,
        format!("GET /routes/api/ws HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n\r\n").as_bytes(),
    );
    assert_eq!(status(&resp), 502, "{resp}");
    assert!(resp.contains("routes do not upgrade") && resp.contains("upstream_invalid"), "{resp}");
}

/// A TLS upstream (the test CA's certificate) that answers each connection's first
/// request with `answer`, read by hand: what no HTTP server library would send.
fn raw_tls_upstream(ca: &TestCa, answer: Vec<u8>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = ca.server_config.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().take(4) {
            let Ok(tcp) = tcp else { return };
            let Ok(conn) = rustls::ServerConnection::new(config.clone()) else { return };
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tls.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = tls.write_all(&answer);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    port
}

/// An API answering with more header fields than the gateway takes, or with what is
/// not HTTP, is `502 upstream_invalid` (the upstream was reached), not
/// `upstream_unreachable`.
#[test]
fn an_api_answering_what_the_gateway_cannot_read_is_upstream_invalid() {
    let fields: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (answer, hint) in [
        (format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n").into_bytes(), "more than 100 fields"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n".to_vec(), "not HTTP the gateway can read"),
    ] {
        // The route trusts the CA in `github.ca_file`: the one that signed both servers.
        let ca = TestCa::new(&["api.test"]);
        let port = raw_tls_upstream(&ca, answer);
        let api = TestOrigin::https(&ca);
        let w = world_at(ca, api, "", "[\"api\"]", "", Some(port));
        let resp = raw::request(
            w.gw.addr,
            format!("GET /routes/api/v1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status(&resp), 502, "{resp}");
        assert!(resp.contains("upstream_invalid") && resp.contains(hint), "{resp}");
        assert!(!resp.contains(SECRET), "{resp}");
    }
}

/// What a route's rules judged is all an upstream can run with the key: a GET with a
/// body (which an upstream that ignores GET bodies reads as a second request) is
/// refused; a `_method` field, in the query or the body, is judged as a method;
/// `Expect` stays behind (the gateway answered it); and paths that climb once an
/// upstream decodes `%u`, fullwidth dots or `.` segments are refused.
#[test]
fn a_route_judges_get_bodies_method_fields_expect_and_decoded_paths() {
    let w = world("paths = [\"/echo\"]\nmethods = [\"GET\", \"POST\"]\n");
    let send = |head: &str, body: &str| {
        raw::request(
            w.gw.addr,
            format!(
                "{head} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let smuggled = "DELETE /echo/admin HTTP/1.1\r\nHost: api.test\r\nX-Swallow: ";
    let resp = send("GET /routes/api/echo", smuggled);
    assert_eq!(status(&resp), 400, "{resp}");
    assert!(resp.contains("GET or HEAD request with a body"), "{resp}");

    let resp = send("POST /routes/api/echo?_method=DELETE", "");
    assert_eq!(status(&resp), 403, "{resp}");
    assert!(resp.contains("route_not_allowed") && resp.contains("_method=DELETE"), "{resp}");
    for (kind, body) in
        [("application/x-www-form-urlencoded", "a=1&_method=DELETE"), ("application/json", "{\"_method\":\"DELETE\"}")]
    {
        let resp = raw::request(
            w.gw.addr,
            format!(
                "POST /routes/api/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n\
                 Content-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        );
        assert_eq!(status(&resp), 403, "{kind}: {resp}");
        assert!(resp.contains("_method=DELETE"), "{resp}");
    }
    // A form that names an allowed method, and a plain form, go through.
    let resp = send("POST /routes/api/echo?_method=GET", "a=1");
    assert_eq!(status(&resp), 200, "{resp}");

    let mut s = raw::connect(w.gw.addr);
    let head = format!(
        "POST /routes/api/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sbx-a:{TOKEN_A}\r\n\
         Content-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let interim = raw::read_head(&mut s);
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    s.write_all(b"hello").unwrap();
    let resp = raw::read_response(&mut s);
    assert_eq!(status(&resp), 200, "{resp}");
    let rec = w.api.recorded().pop().unwrap();
    assert_eq!(rec.method, "POST");
    assert!(header(&rec, "expect").is_none(), "Expect reached the upstream: {:?}", rec.headers);

    for path in ["/echo/%u002e%u002e/admin", "/echo/%EF%BC%8E%EF%BC%8E/admin", "/echo/./x", "/echo/%2e/x"] {
        let resp = send(&format!("GET /routes/api{path}"), "");
        assert_eq!(status(&resp), 400, "{path}: {resp}");
    }
    let methods: Vec<String> = w.api.recorded().iter().map(|r| format!("{} {}", r.method, r.uri)).collect();
    assert_eq!(methods, ["POST /echo?_method=GET", "POST /echo"], "only the allowed requests reached the API");

    // After a request with a body the upstream connection is not used again (an API
    // that ignored the body would read it as the start of the next request, with the
    // key); between bodiless requests it is.
    let bodiless = || send("GET /routes/api/echo", "");
    for resp in [bodiless(), bodiless(), send("POST /routes/api/echo", "a=1"), bodiless()] {
        assert_eq!(status(&resp), 200, "{resp}");
    }
    let peers: Vec<_> = w.api.recorded().iter().skip(2).map(|r| r.peer).collect();
    assert_eq!(peers[0], peers[1], "bodiless requests share a connection");
    assert_eq!(peers[1], peers[2], "a request with a body may take a kept connection");
    assert_ne!(peers[2], peers[3], "the connection that carried a body is not used again");
}
