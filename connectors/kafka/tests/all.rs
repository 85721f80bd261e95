//! The Kafka connectors' integration tests, one binary: each file is a module.

mod support;

mod bad_input;
mod broker_errors;
mod exactly_once;
mod process_kill;
