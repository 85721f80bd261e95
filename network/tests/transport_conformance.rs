//! The transport conformance suite, one test per check, over the in-process transport; and a
//! transport that ignores its credits, which the suite must refuse.

use weir_network::{ChannelConfig, LocalTransport};

fn local(credits: usize) -> LocalTransport {
    LocalTransport::new(ChannelConfig {
        buffers_per_channel: credits,
    })
}

/// The in-process transport: one test per check.
mod local_transport {
    weir_network::transport_conformance!(super::local);
}

/// A transport that grants one credit more than it was made with: more in flight than the
/// bound allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_that_overdraws_its_credits_fails_the_suite() {
    use futures::FutureExt;
    let suite = weir_network::conformance::run_all(|credits| local(credits + 1));
    let result = std::panic::AssertUnwindSafe(suite).catch_unwind().await;
    assert!(
        result.is_err(),
        "the suite passed a transport that ignores its credits"
    );
}
