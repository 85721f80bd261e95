//! The `weir` command-line tool: `weir checkpoints list | inspect | verify | gc` (see
//! `weir_runtime::cli`).

use clap::Parser;
use futures::FutureExt;
use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::Mutex;
use weir_runtime::cli::{Cli, CliError, panic_message};

/// Where the last panic happened, kept by the panic hook for the error message.
static LAST_PANIC_LOCATION: Mutex<Option<String>> = Mutex::new(None);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A panic (a bug, here or in a library) is not printed by the default hook: the ones the
    // tool expects (opendal's lister on a symbolic link) become errors naming the path, and any
    // other is reported below with the location this hook keeps.
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut last) = LAST_PANIC_LOCATION.lock() {
            *last = info.location().map(|l| l.to_string());
        }
    }));

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = AssertUnwindSafe(weir_runtime::cli::run(&cli, &mut out))
        .catch_unwind()
        .await;
    let flushed = out.flush();
    let result = match result {
        Ok(result) => result,
        Err(payload) => {
            let location = LAST_PANIC_LOCATION
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_else(|| "an unknown location".to_string());
            let _ = writeln!(
                std::io::stderr(),
                "weir: error: internal error (a bug): {} at {location}",
                panic_message(payload.as_ref())
            );
            return ExitCode::FAILURE;
        }
    };
    match (result, flushed) {
        (Ok(code), Ok(())) => ExitCode::from(code),
        // The reader went away (`weir … | head`): not an error worth a message.
        (Err(CliError::Output(e)), _) | (Ok(_), Err(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        (Ok(_), Err(e)) => report(&CliError::Output(e)),
        (Err(e), _) => report(&e),
    }
}

fn report(e: &CliError) -> ExitCode {
    // If stderr is gone too there is nobody to tell; the exit code still says it.
    let _ = writeln!(std::io::stderr(), "weir: error: {e}");
    ExitCode::from(e.exit_code())
}
