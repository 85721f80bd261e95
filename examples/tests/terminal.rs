//! On a terminal `word_count` shows one live line (records/s, records, checkpoints, the last
//! checkpoint's duration); piped, it prints plain lines only, and its REST API is announced on
//! stderr.

use std::process::Command;

fn word_count() -> &'static str {
    env!("CARGO_BIN_EXE_word_count")
}

#[test]
fn a_terminal_gets_a_live_line_and_a_pipe_plain_lines() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck").to_string_lossy().to_string();
    let args = format!(
        "{} --records 2000000 --checkpoint-interval 50ms --checkpoint-dir {ck} --no-rest",
        word_count()
    );
    // `script` runs it on a pseudo-terminal (util-linux, in every Debian).
    let tty = Command::new("script")
        .args(["-qec", &args, "/dev/null"])
        .output()
        .unwrap();
    assert!(
        tty.status.success(),
        "{}",
        String::from_utf8_lossy(&tty.stderr)
    );
    let shown = String::from_utf8_lossy(&tty.stdout).replace('\r', "\n");
    let live = shown
        .lines()
        .filter(|l| l.contains("records/s · ") && l.contains(" checkpoints (last "))
        .count();
    assert!(live >= 1, "no live line on a terminal:\n{shown}");
    assert!(shown.contains("summary: records=2000000"), "{shown}");
    let piped = Command::new(word_count())
        .args(["--records", "200000", "--checkpoint-interval", "50ms"])
        .args(["--checkpoint-dir", &format!("{ck}-2")])
        .output()
        .unwrap();
    assert!(piped.status.success());
    let out = String::from_utf8_lossy(&piped.stdout);
    assert!(!out.contains("records/s · "), "{out}");
    assert!(out.contains("summary: records=200000"), "{out}");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(err.contains("REST API: http://127.0.0.1:"), "{err}");
}
