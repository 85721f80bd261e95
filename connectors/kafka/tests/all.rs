//! The Kafka connectors' integration tests, one binary: each file is a module.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod bad_input;
mod broker_errors;
mod exactly_once;
mod process_kill;
mod source_options;
