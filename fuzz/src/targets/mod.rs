//! The fuzz targets, one per decoder, and running one by name.

pub mod channel_state;
pub mod codec;
pub mod identity;
pub mod keyed;
mod keyed_mutate;
pub mod metadata;
pub mod operator;
pub mod protocol;
pub mod tcp;

use crate::harness::{self, Budget, Checked, Report};
use std::time::Duration;

/// Every target's name, in the order a full run takes them.
pub const NAMES: [&str; 8] = [
    "metadata",
    "keyed",
    "channel-state",
    "operator",
    "codec",
    "tcp",
    "protocol",
    "identity",
];

/// Fuzzes the target `name` within `budget`; `None` when there is no such target.
pub fn fuzz(name: &str, budget: &Budget) -> Option<Report> {
    Some(match name {
        "metadata" => harness::fuzz(&metadata::Metadata, budget),
        "keyed" => harness::fuzz(&keyed::Keyed::new(), budget),
        "channel-state" => harness::fuzz(&channel_state::ChannelState, budget),
        "operator" => harness::fuzz(&operator::Operator, budget),
        "codec" => harness::fuzz(&codec::Codec, budget),
        "tcp" => harness::fuzz(&tcp::Tcp, budget),
        "protocol" => harness::fuzz(&protocol::Protocol, budget),
        "identity" => harness::fuzz(&identity::Identity, budget),
        _ => return None,
    })
}

/// Generates input `seed` of the target `name` again and runs it: its description and run.
pub fn replay(name: &str, seed: u64, hang: Duration) -> Option<(String, Checked)> {
    match name {
        "metadata" => harness::replay(&metadata::Metadata, seed, hang),
        "keyed" => harness::replay(&keyed::Keyed::new(), seed, hang),
        "channel-state" => harness::replay(&channel_state::ChannelState, seed, hang),
        "operator" => harness::replay(&operator::Operator, seed, hang),
        "codec" => harness::replay(&codec::Codec, seed, hang),
        "tcp" => harness::replay(&tcp::Tcp, seed, hang),
        "protocol" => harness::replay(&protocol::Protocol, seed, hang),
        "identity" => harness::replay(&identity::Identity, seed, hang),
        _ => None,
    }
}
