//! The job verbs of the `weir` tool, over a running job's REST API with Flink's verbs and
//! flags: `list`, `cancel`, `savepoint`, `stop`, `checkpoint`, each with `--rest URL`. A plain
//! HTTP/1.1 client over a socket (the API is loopback by default and speaks no TLS).

use super::CliError;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a verb waits for the server, and for a savepoint or checkpoint to complete.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const OPERATION_TIMEOUT: Duration = Duration::from_secs(600);

/// A REST API's address, from `http://host:port` (a trailing `/` allowed).
pub(super) fn authority(rest: &str) -> Result<String, CliError> {
    let rest = rest.trim_end_matches('/');
    match rest.strip_prefix("http://") {
        Some(a) if !a.is_empty() && !a.contains('/') => Ok(if a.contains(':') {
            a.to_string()
        } else {
            format!("{a}:80")
        }),
        _ => Err(CliError::Usage(format!(
            "--rest {rest}: expected http://HOST:PORT (the job's REST API; https is not served)"
        ))),
    }
}

/// One request; the status and the body parsed as JSON.
fn request(address: &str, method: &str, path: &str, body: &str) -> Result<(u16, Value), CliError> {
    let unreachable = |e: std::io::Error| {
        CliError::Failed(format!("cannot reach the REST API at {address}: {e}"))
    };
    let mut s = TcpStream::connect(address).map_err(unreachable)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(unreachable)?;
    s.set_write_timeout(Some(REQUEST_TIMEOUT))
        .map_err(unreachable)?;
    let text = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(text.as_bytes()).map_err(unreachable)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(unreachable)?;
    let raw = String::from_utf8_lossy(&raw);
    let bad = || CliError::Failed(format!("{address} did not answer HTTP"));
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    Ok((status, value))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest.get(n + 2..).unwrap_or("");
    }
    out
}

/// The answer's JSON if its status is a success; otherwise its errors, as the verb's error
/// (a 4xx is a usage error: no such job, read-only API, bad arguments).
fn expect(answer: (u16, Value), what: &str) -> Result<Value, CliError> {
    let (status, value) = answer;
    if (200..300).contains(&status) {
        return Ok(value);
    }
    let errors = value["errors"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_else(|| value.to_string());
    let message = format!("{what}: {errors} (HTTP {status})");
    Err(if (400..500).contains(&status) {
        CliError::Usage(message)
    } else {
        CliError::Failed(message)
    })
}

/// `weir list`: the jobs the API serves, one line each.
pub(super) fn list(rest: &str, out: &mut dyn Write) -> Result<u8, CliError> {
    let a = authority(rest)?;
    let jobs = expect(request(&a, "GET", "/jobs/overview", "")?, "list")?;
    let jobs = jobs["jobs"].as_array().cloned().unwrap_or_default();
    let line = |j: &Value| {
        format!(
            "{} : {} : {} ({})",
            j["start-time"].as_u64().map_or("?".into(), flink_time),
            j["jid"].as_str().unwrap_or("?"),
            j["name"].as_str().unwrap_or("?"),
            j["state"].as_str().unwrap_or("?"),
        )
    };
    let ended = |j: &Value| {
        matches!(
            j["state"].as_str(),
            Some("FINISHED" | "CANCELED" | "FAILED" | "SUSPENDED")
        )
    };
    // Flink's `flink list -a`: the running jobs, then the terminated ones.
    let running: Vec<String> = jobs.iter().filter(|j| !ended(j)).map(line).collect();
    let terminated: Vec<String> = jobs.iter().filter(|j| ended(j)).map(line).collect();
    let rule = "--------------------------------------------------------------";
    if running.is_empty() {
        writeln!(out, "No running jobs.")?;
    } else {
        writeln!(
            out,
            "------------------ Running/Restarting Jobs -------------------"
        )?;
        for l in &running {
            writeln!(out, "{l}")?;
        }
        writeln!(out, "{rule}")?;
    }
    if terminated.is_empty() {
        writeln!(out, "No terminated jobs.")?;
    } else {
        writeln!(
            out,
            "---------------------- Terminated Jobs -----------------------"
        )?;
        for l in &terminated {
            writeln!(out, "{l}")?;
        }
        writeln!(out, "{rule}")?;
    }
    Ok(0)
}

/// `ms` since the Unix epoch as Flink's CLI prints a job's start: `dd.MM.yyyy HH:mm:ss` (UTC).
fn flink_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), in the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{day:02}.{month:02}.{year} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// `weir cancel JOB`.
pub(super) fn cancel(rest: &str, job: &str, out: &mut dyn Write) -> Result<u8, CliError> {
    let a = authority(rest)?;
    let path = format!("/jobs/{job}?mode=cancel");
    expect(request(&a, "PATCH", &path, "")?, "cancel")?;
    writeln!(out, "Cancelled job {job}.")?;
    Ok(0)
}

/// Starts an asynchronous operation at `path` with `body` and waits for its result at
/// `status_path/<trigger id>`; the location it reports.
fn operation(
    a: &str,
    path: &str,
    body: &Value,
    status_path: &str,
    what: &str,
) -> Result<String, CliError> {
    let started = expect(request(a, "POST", path, &body.to_string())?, what)?;
    let trigger = started["request-id"]
        .as_str()
        .ok_or_else(|| CliError::Failed(format!("{what}: no request-id in {started}")))?
        .to_string();
    let deadline = Instant::now() + OPERATION_TIMEOUT;
    loop {
        let op = expect(
            request(a, "GET", &format!("{status_path}/{trigger}"), "")?,
            what,
        )?;
        if op["status"]["id"] == "COMPLETED" {
            if let Some(location) = op["operation"]["location"].as_str() {
                return Ok(location.to_string());
            }
            let cause = &op["operation"]["failure-cause"]["stack-trace"];
            return Err(CliError::Failed(format!(
                "{what} failed: {}",
                cause.as_str().unwrap_or("no reason given")
            )));
        }
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "{what}: still in progress after {OPERATION_TIMEOUT:?} (trigger {trigger})"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `weir savepoint JOB [DIR]`.
pub(super) fn savepoint(
    rest: &str,
    job: &str,
    dir: Option<&str>,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let a = authority(rest)?;
    let body = serde_json::json!({ "target-directory": dir, "cancel-job": false });
    let location = operation(
        &a,
        &format!("/jobs/{job}/savepoints"),
        &body,
        &format!("/jobs/{job}/savepoints"),
        "savepoint",
    )?;
    writeln!(out, "Savepoint completed. Path: {location}")?;
    Ok(0)
}

/// `weir stop --savepoint-path DIR [--drain] JOB`.
pub(super) fn stop(
    rest: &str,
    job: &str,
    dir: Option<&str>,
    drain: bool,
    out: &mut dyn Write,
) -> Result<u8, CliError> {
    let a = authority(rest)?;
    let body = serde_json::json!({ "targetDirectory": dir, "drain": drain });
    let location = operation(
        &a,
        &format!("/jobs/{job}/stop"),
        &body,
        &format!("/jobs/{job}/savepoints"),
        "stop",
    )?;
    writeln!(out, "Savepoint completed. Path: {location}")?;
    Ok(0)
}

/// `weir checkpoint JOB`.
pub(super) fn checkpoint(rest: &str, job: &str, out: &mut dyn Write) -> Result<u8, CliError> {
    let a = authority(rest)?;
    let location = operation(
        &a,
        &format!("/jobs/{job}/checkpoints"),
        &serde_json::json!({}),
        &format!("/jobs/{job}/checkpoints"),
        "checkpoint",
    )?;
    writeln!(out, "Checkpoint completed for job {job}. Path: {location}")?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rest_url_is_http_host_and_port() {
        assert_eq!(
            authority("http://127.0.0.1:8081/").unwrap(),
            "127.0.0.1:8081"
        );
        assert_eq!(authority("http://example").unwrap(), "example:80");
        for bad in [
            "https://h:1",
            "127.0.0.1:8081",
            "http://",
            "http://h:1/jobs",
        ] {
            assert!(matches!(authority(bad), Err(CliError::Usage(_))), "{bad}");
        }
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }

    #[test]
    fn start_times_print_as_flink_s_cli_prints_them() {
        assert_eq!(flink_time(0), "01.01.1970 00:00:00");
        // 2026-12-03 11:40:05 UTC.
        assert_eq!(flink_time(1_796_298_005_000), "03.12.2026 11:40:05");
        // A leap day.
        assert_eq!(flink_time(951_782_400_000), "29.02.2000 00:00:00");
    }
}
