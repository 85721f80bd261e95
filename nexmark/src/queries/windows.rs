//! The windowed queries: q5 (bids per auction in sliding windows, then the auctions with the
//! most per window), q7 (the bids at each tumbling window's highest price) and q11 (bids per
//! bidder session). A second stage that needs every partial result of a window waits for it
//! with an event-time timer at the window's end: the first stage fires a window at the
//! watermark that passes its end and sends its results ahead of that watermark.

use super::{HOP_MS, WINDOW_MS};
use crate::model::Bid;
use crate::rows::Row;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use weir_runtime::keyed::TimeDomain;
use weir_runtime::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry};
use weir_runtime::state::{AggregateFunction, ListState, ListStateDescriptor};
use weir_runtime::window::{
    EventTimeSessionWindows, SlidingEventTimeWindows, TimeWindow, TumblingEventTimeWindows,
};
use weir_runtime::{DataStream, TaskError, ValueState, ValueStateDescriptor};

fn ms(ms: i64) -> Duration {
    Duration::from_millis(ms as u64)
}

fn not_open() -> TaskError {
    TaskError::Operator {
        operator: "Nexmark".into(),
        message: "a state was used before open".into(),
    }
}

/// Counts records.
struct Count;

impl<T: 'static> AggregateFunction<T, u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, _: T, acc: &mut u64) {
        *acc += 1;
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

/// A bid's auction and time.
type AuctionBid = (u64, i64);
/// One auction's bids in one window: `(window start, auction, bids)`.
type AuctionCount = (i64, u64, u64);

/// q5: per 10 s window sliding by 2 s, the auctions with the most bids (all of them on a tie).
pub(super) fn q5(bids: DataStream<Bid>) -> DataStream<Row> {
    bids.map(|b| (b.auction, b.date_time))
        .name("q5 Auction Bids")
        .key_by(|b: &AuctionBid| &b.0)
        .window(SlidingEventTimeWindows::of(ms(WINDOW_MS), ms(HOP_MS)))
        .timestamps(|b: &AuctionBid| b.1)
        .uid("q5-counts")
        .aggregate_with(Count, |auction: &u64, w: &TimeWindow, n: u64| {
            (w.start, *auction, n)
        })
        .key_by(|c: &AuctionCount| &c.0)
        .process("q5 Hot Items", HotItems::default)
        .uid("q5-hot-items")
}

/// q5's second stage, keyed by window start: the most bids so far, and the auctions with them
/// in a list state (appended to, not rewritten, as ties come in).
#[derive(Default)]
struct HotItems {
    most: Option<ValueState<u64>>,
    auctions: Option<ListState<u64>>,
}

impl HotItems {
    fn states(&self) -> Result<(ValueState<u64>, ListState<u64>), TaskError> {
        self.most.zip(self.auctions).ok_or_else(not_open)
    }
}

impl KeyedProcessFunction<i64, AuctionCount, Row> for HotItems {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, i64>) -> Result<(), TaskError> {
        self.most = Some(states.value_state(&ValueStateDescriptor::new("most-bids"))?);
        self.auctions = Some(states.list_state(&ListStateDescriptor::new("hot-auctions"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (start, auction, n): AuctionCount,
        ctx: &mut KeyedContext<'_, i64>,
        _out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let (most, auctions) = self.states()?;
        match ctx.value(most).copied() {
            Some(max) if n < max => {}
            Some(max) if n == max => ctx.state().list_add(auctions, auction),
            _ => {
                ctx.update(most, n);
                ctx.state().list_update(auctions, vec![auction]);
                ctx.register_event_time_timer(start + WINDOW_MS - 1);
            }
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let (most, auctions) = self.states()?;
        let window_start = *ctx.current_key();
        let Some(num) = ctx.value(most).copied() else {
            return Ok(());
        };
        let hot: Vec<u64> = ctx.state().list(auctions).copied().collect();
        ctx.clear(most);
        ctx.state().list_update(auctions, Vec::new());
        for auction in hot {
            out.collect(Row::Q5 {
                window_start,
                auction,
                num,
            })?;
        }
        Ok(())
    }
}

/// Buckets q7's first stage spreads each window's bids over.
const Q7_BUCKETS: u64 = 128;

/// A bid offered to one of q7's windows: `(bucket, window start, at the window's end, bid)`.
/// A bid at exactly a window's end belongs to the next window but also matches this one
/// (`BETWEEN window_end - 10 s AND window_end` is inclusive).
type Q7Offer = (u64, i64, bool, Bid);

/// The highest price among a window's own bids and the bids at it, and the same for the bids
/// at its end: `(price, bids)` each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Highest {
    inside: (u64, Vec<Bid>),
    at_end: (u64, Vec<Bid>),
}

fn keep_highest(best: &mut (u64, Vec<Bid>), bid: Bid) {
    if bid.price > best.0 || best.1.is_empty() {
        best.0 = bid.price;
        best.1.clear();
    }
    if bid.price == best.0 {
        best.1.push(bid);
    }
}

fn merge_highest(mut a: (u64, Vec<Bid>), b: (u64, Vec<Bid>)) -> (u64, Vec<Bid>) {
    for bid in b.1 {
        keep_highest(&mut a, bid);
    }
    a
}

impl Highest {
    fn merge(self, other: Highest) -> Highest {
        Highest {
            inside: merge_highest(self.inside, other.inside),
            at_end: merge_highest(self.at_end, other.at_end),
        }
    }
}

struct HighestBids;

impl AggregateFunction<Q7Offer, Highest, Highest> for HighestBids {
    fn create_accumulator(&self) -> Highest {
        Highest::default()
    }
    fn add(&self, (_, _, at_end, bid): Q7Offer, acc: &mut Highest) {
        keep_highest(
            if at_end {
                &mut acc.at_end
            } else {
                &mut acc.inside
            },
            bid,
        );
    }
    fn get_result(&self, acc: &Highest) -> Highest {
        acc.clone()
    }
    fn merge(&self, a: Highest, b: Highest) -> Highest {
        a.merge(b)
    }
}

/// q7: per 10 s tumbling window, every bid at the window's highest price whose time is in the
/// window or at its end. Per bucket of auctions, then per window.
pub(super) fn q7(bids: DataStream<Bid>) -> DataStream<Row> {
    bids.flat_map(|b| {
        let start = b.date_time - b.date_time.rem_euclid(WINDOW_MS);
        let bucket = b.auction % Q7_BUCKETS;
        let at_previous_end =
            (start == b.date_time).then(|| (bucket, start - WINDOW_MS, true, b.clone()));
        std::iter::once((bucket, start, false, b)).chain(at_previous_end)
    })
    .name("q7 Offers")
    .key_by(|o: &Q7Offer| &o.0)
    .window(TumblingEventTimeWindows::of(ms(WINDOW_MS)))
    .timestamps(|o: &Q7Offer| o.1)
    .uid("q7-bucket-highest")
    .aggregate_with(HighestBids, |_: &u64, w: &TimeWindow, h: Highest| {
        (w.start, h)
    })
    .key_by(|p: &(i64, Highest)| &p.0)
    .process("q7 Highest Bids", WindowHighest::default)
    .uid("q7-highest")
}

/// q7's second stage, keyed by window start: the buckets' highest bids merged.
#[derive(Default)]
struct WindowHighest {
    highest: Option<ValueState<Highest>>,
}

impl KeyedProcessFunction<i64, (i64, Highest), Row> for WindowHighest {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, i64>) -> Result<(), TaskError> {
        self.highest = Some(states.value_state(&ValueStateDescriptor::new("highest-bids"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (start, partial): (i64, Highest),
        ctx: &mut KeyedContext<'_, i64>,
        _out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let highest = self.highest.ok_or_else(not_open)?;
        let merged = match ctx.value(highest).cloned() {
            Some(h) => h.merge(partial),
            None => partial,
        };
        ctx.update(highest, merged);
        ctx.register_event_time_timer(start + WINDOW_MS - 1);
        Ok(())
    }

    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, i64>,
        out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let highest = self.highest.ok_or_else(not_open)?;
        let Some(h) = ctx.value(highest).cloned() else {
            return Ok(());
        };
        ctx.clear(highest);
        // A window with no bid of its own (only bids at its end) has no highest price.
        if h.inside.1.is_empty() {
            return Ok(());
        }
        let max = h.inside.0;
        let at_end = if h.at_end.0 == max {
            h.at_end.1
        } else {
            Vec::new()
        };
        for bid in h.inside.1.into_iter().chain(at_end) {
            out.collect(Row::Bid(bid))?;
        }
        Ok(())
    }
}

/// q11: bids per bidder per session, sessions closing after 10 s without a bid.
pub(super) fn q11(bids: DataStream<Bid>) -> DataStream<Row> {
    bids.map(|b| (b.bidder, b.date_time))
        .name("q11 Bidders")
        .key_by(|b: &(u64, i64)| &b.0)
        .window(EventTimeSessionWindows::with_gap(ms(WINDOW_MS)))
        .timestamps(|b: &(u64, i64)| b.1)
        .uid("q11-sessions")
        .aggregate_with(Count, |bidder: &u64, w: &TimeWindow, n: u64| Row::Q11 {
            bidder: *bidder,
            bid_count: n,
            session_start: w.start,
            session_end: w.end,
        })
}
