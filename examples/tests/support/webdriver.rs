//! A W3C WebDriver client for the web UI test: starts Debian's `chromedriver` on loopback,
//! opens a headless Chromium session, and drives it (navigate, run a script, find, click, type,
//! accept a dialog, screenshot) over plain HTTP with JSON. The browser binaries come from
//! `WEIR_CHROMIUM_BIN` and `WEIR_CHROMEDRIVER_BIN` (`cargo xtask` sets them, installing Debian's
//! `chromium` and `chromium-driver` when missing), else `/usr/bin`.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The element reference key of the W3C protocol.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn binary(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.is_file(),
        "{} is missing: run the test through `cargo xtask test` (or `ci`), which installs \
         Debian's chromium and chromium-driver, or set {var}",
        path.display()
    );
    path
}

/// One HTTP/1.1 request to `port` on loopback; the status and the JSON body.
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to chromedriver");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    // Read the head, then the body by its length (chromedriver may keep the connection open).
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf).expect("read chromedriver's answer");
        assert!(n > 0, "chromedriver closed the connection mid-answer");
        answer.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let length = head.lines().find_map(|l| {
        l.strip_prefix("content-length:")
            .and_then(|v| v.trim().parse::<usize>().ok())
    });
    let body = match length {
        Some(n) => {
            while answer.len() < head_end + n {
                let got = stream.read(&mut buf).expect("read chromedriver's answer");
                assert!(got > 0, "chromedriver closed the connection mid-body");
                answer.extend_from_slice(&buf[..got]);
            }
            String::from_utf8_lossy(&answer[head_end..head_end + n]).to_string()
        }
        None => {
            // Chunked or closed-delimited: read to the end.
            let _ = stream.read_to_end(&mut answer);
            let rest = String::from_utf8_lossy(&answer[head_end..]).to_string();
            if head.contains("transfer-encoding: chunked") {
                dechunk(&rest)
            } else {
                rest
            }
        }
    };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A chunked body's data.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// A chromedriver process and one headless Chromium session; both end when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium of `width`×`height`.
    pub fn start(width: u32, height: u32) -> Browser {
        let chromium = binary("WEIR_CHROMIUM_BIN", "/usr/bin/chromium");
        let chromedriver = binary("WEIR_CHROMEDRIVER_BIN", "/usr/bin/chromedriver");
        let port = super::processes::free_port();
        let mut driver = Command::new(&chromedriver)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
        let give_up = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err()
            || http(port, "GET", "/status", None).1["value"]["ready"] != json!(true)
        {
            assert!(Instant::now() < give_up, "chromedriver did not get ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        // Without the background-networking flags, Chromium's calls home are refused by a
        // closed network, many at a time.
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={width},{height}"),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let (status, answer) = http(port, "POST", "/session", Some(&capabilities));
        let Some(session) = answer["value"]["sessionId"].as_str().map(str::to_string) else {
            let _ = driver.kill();
            panic!("no browser session ({status}): {answer}");
        };
        Browser {
            driver,
            port,
            session,
            _profile: profile,
        }
    }

    /// A command of the session; its `value`, or a panic naming the WebDriver error.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, answer) = http(self.port, method, &path, body.as_ref());
        assert!(
            status == 200,
            "WebDriver {method} {path} failed ({status}): {answer}"
        );
        answer["value"].clone()
    }

    /// Opens `url`.
    pub fn navigate(&self, url: &str) {
        self.command("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn script(&self, script: &str) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Runs `script` until it returns something other than `null` or `false`, for at most
    /// `within`; what it returned.
    pub fn wait_for(&self, what: &str, script: &str, within: Duration) -> Value {
        let give_up = Instant::now() + within;
        loop {
            let v = self.script(script);
            if !(v.is_null() || v == json!(false)) {
                return v;
            }
            assert!(
                Instant::now() < give_up,
                "{what}: not within {within:?}; the page says: {}",
                self.script("return document.body.innerText")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The element `css` selects (the first).
    fn element(&self, css: &str) -> String {
        let v = self.command(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    /// Clicks the element `css` selects.
    pub fn click(&self, css: &str) {
        let id = self.element(css);
        self.command("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    /// Types `text` into the element `css` selects.
    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.command(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        );
    }

    /// Accepts the open `confirm` dialog.
    pub fn accept_dialog(&self) {
        self.command("POST", "/alert/accept", Some(json!({})));
    }

    /// A PNG of the page, written to `path`; its bytes.
    pub fn screenshot(&self, path: &Path) -> Vec<u8> {
        let v = self.command("GET", "/screenshot", None);
        let png = base64_decode(v.as_str().expect("a base64 screenshot"));
        std::fs::write(path, &png).unwrap();
        png
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = http(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 (the screenshot's encoding) decoded.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let Some(v) = value(c) else { continue };
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
