//! The Nexmark queries as Weir jobs: [`build`] adds the generator source and a query's
//! operators to an environment and returns the stream of its result rows. Every stateful
//! operator has a uid, so a query's savepoint restores into the same query at any parallelism.

mod joins;
mod windows;

use crate::generator::GeneratorConfig;
use crate::model::{Bid, Event};
use crate::rows::{Query, Row};
use std::time::Duration;
use weir_runtime::{DataStream, StreamEnvironment};

/// How far each split's watermark trails the largest event time it emitted: nexmark-flink's
/// `WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND`.
pub const WATERMARK_DELAY: Duration = Duration::from_secs(4);

/// Window sizes of q5, q7, q8 and the session gap of q11, ms (nexmark-flink's SQL).
pub(crate) const WINDOW_MS: i64 = 10_000;
/// q5's slide, ms.
pub(crate) const HOP_MS: i64 = 2_000;

/// Adds the source and `query`'s operators to `env`; the stream of its result rows.
pub fn build(
    env: &StreamEnvironment,
    query: Query,
    config: &GeneratorConfig,
) -> anyhow::Result<DataStream<Row>> {
    config.validate().map_err(anyhow::Error::msg)?;
    Ok(on(query, source(env, config)))
}

/// `query`'s operators over `events` (the generator's, perhaps through a failure injector).
pub fn on(query: Query, events: DataStream<Event>) -> DataStream<Row> {
    match query {
        Query::Q0 => bids(events).map(Row::Bid).name("q0"),
        Query::Q1 => bids(events)
            .map(|b| Row::Q1 {
                auction: b.auction,
                bidder: b.bidder,
                price_milli: u128::from(b.price) * 908,
                date_time: b.date_time,
                extra: b.extra,
            })
            .name("q1"),
        Query::Q2 => bids(events)
            .filter(|b| b.auction % 123 == 0)
            .map(|b| Row::Q2 {
                auction: b.auction,
                price: b.price,
            })
            .name("q2"),
        Query::Q3 => joins::q3(events),
        Query::Q4 => joins::q4(events),
        Query::Q5 => windows::q5(bids(events)),
        Query::Q7 => windows::q7(bids(events)),
        Query::Q8 => joins::q8(events),
        Query::Q11 => windows::q11(bids(events)),
    }
}

/// The generator as a replayable source: event `n` is `config.event(n)`, split `s` of `p` reads
/// events `s, s + p, …` in order with its own watermark, checkpointed with its position.
pub fn source(env: &StreamEnvironment, config: &GeneratorConfig) -> DataStream<Event> {
    let generator = config.clone();
    env.from_generator_with_watermarks(
        config.events,
        move |n| generator.event(n),
        WATERMARK_DELAY,
        |e: &Event| e.date_time(),
    )
    .uid("nexmark-source")
    .name("Nexmark Source")
}

/// The bids among the events.
fn bids(events: DataStream<Event>) -> DataStream<Bid> {
    events
        .flat_map(|e| match e {
            Event::Bid(b) => Some(b),
            _ => None,
        })
        .name("Bids")
}
