//! The queries that join people with auctions or auctions with bids: q3 (an incremental join
//! on the seller, both sides kept), q4 (winning bids joined to their auction, averaged per
//! category as an updating result) and q8 (people and their auctions in one tumbling window).

use super::WINDOW_MS;
use crate::model::Event;
use crate::rows::Row;
use std::time::Duration;
use weir_runtime::co::KeyedCoProcessFunction;
use weir_runtime::keyed::{Collector, KeyedContext, KeyedProcessFunction, KeyedStateRegistry};
use weir_runtime::state::{AggregateFunction, ListState, ListStateDescriptor};
use weir_runtime::window::{TimeWindow, TumblingEventTimeWindows};
use weir_runtime::{DataStream, TaskError, ValueState, ValueStateDescriptor};

/// The states q3 keeps its sellers in.
const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];

/// A seller of q3: `(id, name, city, state)`.
type Seller = (u64, String, String, String);
/// An auction of q3: `(seller, auction id)`.
type Listing = (u64, u64);

/// q3: the name, city and state of each seller in OR, ID or CA of an auction in category 10.
/// A regular inner join: each side waits in keyed state for the other, for ever (as Flink's
/// regular join without state TTL).
pub(super) fn q3(events: DataStream<Event>) -> DataStream<Row> {
    let sellers = events
        .clone()
        .flat_map(|e| match e {
            Event::Person(p) if Q3_STATES.contains(&p.state.as_str()) => {
                Some((p.id, p.name, p.city, p.state))
            }
            _ => None,
        })
        .name("q3 Sellers");
    let listings = events
        .flat_map(|e| match e {
            Event::Auction(a) if a.category == 10 => Some((a.seller, a.id)),
            _ => None,
        })
        .name("q3 Auctions");
    sellers
        .connect(listings)
        .key_by(|s: &Seller| &s.0, |l: &Listing| &l.0)
        .process("q3 Join", Q3Join::default)
        .uid("q3-join")
}

#[derive(Default)]
struct Q3Join {
    seller: Option<ValueState<(String, String, String)>>,
    waiting: Option<ListState<u64>>,
}

/// q3's states: the seller, and the auctions waiting for them.
type Q3States = (ValueState<(String, String, String)>, ListState<u64>);

impl Q3Join {
    fn states(&self) -> Result<Q3States, TaskError> {
        self.seller.zip(self.waiting).ok_or_else(not_open)
    }
}

fn not_open() -> TaskError {
    TaskError::Operator {
        operator: "Nexmark".into(),
        message: "a state was used before open".into(),
    }
}

impl KeyedCoProcessFunction<u64, Seller, Listing, Row> for Q3Join {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.seller = Some(states.value_state(&ValueStateDescriptor::new("seller"))?);
        self.waiting = Some(states.list_state(&ListStateDescriptor::new("auctions"))?);
        Ok(())
    }

    fn process_element1(
        &mut self,
        (_, name, city, state): Seller,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let (seller, waiting) = self.states()?;
        let auctions: Vec<u64> = ctx.state().list(waiting).copied().collect();
        for id in auctions {
            out.collect(Row::Q3 {
                name: name.clone(),
                city: city.clone(),
                state: state.clone(),
                id,
            })?;
        }
        ctx.state().list_update(waiting, Vec::new());
        ctx.update(seller, (name, city, state));
        Ok(())
    }

    fn process_element2(
        &mut self,
        (_, id): Listing,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let (seller, waiting) = self.states()?;
        if let Some((name, city, state)) = ctx.value(seller) {
            let row = Row::Q3 {
                name: name.clone(),
                city: city.clone(),
                state: state.clone(),
                id,
            };
            return out.collect(row);
        }
        ctx.state().list_add(waiting, id);
        Ok(())
    }
}

/// An auction of q4: `(id, category, opens, expires)`.
type Q4Auction = (u64, u64, i64, i64);
/// A bid of q4: `(auction, price, time)`.
type Q4Bid = (u64, u64, i64);
/// A change of one auction's winning price: `(category, previous, new)`.
type Q4Change = (u64, Option<u64>, u64);

/// q4: per category, the average winning price of its auctions, where an auction's winning
/// price is its highest bid between its opening and its expiry (both included). Two keyed
/// stages: per auction, the winning price so far (bids that come before their auction wait
/// for it); per category, the sum and count of winning prices, each change emitted as a new
/// version of the category's average.
pub(super) fn q4(events: DataStream<Event>) -> DataStream<Row> {
    let auctions = events
        .clone()
        .flat_map(|e| match e {
            Event::Auction(a) => Some((a.id, a.category, a.date_time, a.expires)),
            _ => None,
        })
        .name("q4 Auctions");
    let bids = events
        .flat_map(|e| match e {
            Event::Bid(b) => Some((b.auction, b.price, b.date_time)),
            _ => None,
        })
        .name("q4 Bids");
    auctions
        .connect(bids)
        .key_by(|a: &Q4Auction| &a.0, |b: &Q4Bid| &b.0)
        .process("q4 Winning Bids", Q4Winner::default)
        .uid("q4-winning-bids")
        .key_by(|c: &Q4Change| &c.0)
        .process("q4 Average", Q4Average::default)
        .uid("q4-average")
}

#[derive(Default)]
struct Q4Winner {
    /// `(category, opens, expires)`.
    auction: Option<ValueState<(u64, i64, i64)>>,
    winning: Option<ValueState<u64>>,
    /// Bids before their auction: `(price, time)`.
    waiting: Option<ListState<(u64, i64)>>,
}

type Q4States = (
    ValueState<(u64, i64, i64)>,
    ValueState<u64>,
    ListState<(u64, i64)>,
);

impl Q4Winner {
    fn states(&self) -> Result<Q4States, TaskError> {
        match (self.auction, self.winning, self.waiting) {
            (Some(a), Some(w), Some(l)) => Ok((a, w, l)),
            _ => Err(not_open()),
        }
    }

    /// Raises the auction's winning price to `price` if higher, emitting the change.
    fn offer(
        winning: ValueState<u64>,
        category: u64,
        price: u64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Q4Change>,
    ) -> Result<(), TaskError> {
        let previous = ctx.value(winning).copied();
        if previous.is_none_or(|p| price > p) {
            ctx.update(winning, price);
            out.collect((category, previous, price))?;
        }
        Ok(())
    }
}

impl KeyedCoProcessFunction<u64, Q4Auction, Q4Bid, Q4Change> for Q4Winner {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.auction = Some(states.value_state(&ValueStateDescriptor::new("auction"))?);
        self.winning = Some(states.value_state(&ValueStateDescriptor::new("winning-price"))?);
        self.waiting = Some(states.list_state(&ListStateDescriptor::new("early-bids"))?);
        Ok(())
    }

    fn process_element1(
        &mut self,
        (_, category, opens, expires): Q4Auction,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Q4Change>,
    ) -> Result<(), TaskError> {
        let (auction, winning, waiting) = self.states()?;
        ctx.update(auction, (category, opens, expires));
        let early: Vec<(u64, i64)> = ctx.state().list(waiting).copied().collect();
        ctx.state().list_update(waiting, Vec::new());
        let best = early
            .iter()
            .filter(|(_, t)| (opens..=expires).contains(t))
            .map(|(p, _)| *p)
            .max();
        match best {
            Some(price) => Self::offer(winning, category, price, ctx, out),
            None => Ok(()),
        }
    }

    fn process_element2(
        &mut self,
        (_, price, time): Q4Bid,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Q4Change>,
    ) -> Result<(), TaskError> {
        let (auction, winning, waiting) = self.states()?;
        match ctx.value(auction).copied() {
            Some((category, opens, expires)) => {
                if (opens..=expires).contains(&time) {
                    Self::offer(winning, category, price, ctx, out)?;
                }
                Ok(())
            }
            None => {
                ctx.state().list_add(waiting, (price, time));
                Ok(())
            }
        }
    }
}

#[derive(Default)]
struct Q4Average {
    /// `(sum of winning prices, auctions, version)`.
    totals: Option<ValueState<(u128, u64, u64)>>,
}

impl KeyedProcessFunction<u64, Q4Change, Row> for Q4Average {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.totals = Some(states.value_state(&ValueStateDescriptor::new("category-totals"))?);
        Ok(())
    }

    fn process_element(
        &mut self,
        (category, previous, price): Q4Change,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Row>,
    ) -> Result<(), TaskError> {
        let totals = self.totals.ok_or_else(not_open)?;
        let (mut sum, mut count, version) = ctx.value(totals).copied().unwrap_or((0, 0, 0));
        match previous {
            Some(p) => sum = sum - u128::from(p) + u128::from(price),
            None => {
                sum += u128::from(price);
                count += 1;
            }
        }
        ctx.update(totals, (sum, count, version + 1));
        out.collect(Row::Q4 {
            category,
            avg: (sum / u128::from(count.max(1))) as u64,
            version: version + 1,
        })
    }
}

/// One side of q8: `(person id, Some(name))` for a person, `(seller, None)` for an auction,
/// with its time.
type Q8In = (u64, Option<String>, i64);

/// q8: each person who created an auction in the same 10 s tumbling window they joined in.
pub(super) fn q8(events: DataStream<Event>) -> DataStream<Row> {
    let people = events
        .clone()
        .flat_map(|e| match e {
            Event::Person(p) => Some((p.id, Some(p.name), p.date_time)),
            _ => None,
        })
        .name("q8 People");
    let sellers = events
        .flat_map(|e| match e {
            Event::Auction(a) => Some((a.seller, None, a.date_time)),
            _ => None,
        })
        .name("q8 Sellers");
    people
        .union(vec![sellers])
        .key_by(|r: &Q8In| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(
            WINDOW_MS as u64,
        )))
        .timestamps(|r: &Q8In| r.2)
        .uid("q8-window")
        .aggregate_with(NewSeller, |id: &u64, w: &TimeWindow, found| {
            found.map(|name| Row::Q8 {
                id: *id,
                name,
                window_start: w.start,
            })
        })
        .flat_map(|row| row)
        .name("q8 New Sellers")
}

/// q8's window: the person's name, if they joined in it, and whether they sold in it.
struct NewSeller;

impl AggregateFunction<Q8In, (Option<String>, bool), Option<String>> for NewSeller {
    fn create_accumulator(&self) -> (Option<String>, bool) {
        (None, false)
    }

    fn add(&self, (_, name, _): Q8In, acc: &mut (Option<String>, bool)) {
        match name {
            Some(n) => acc.0 = Some(n),
            None => acc.1 = true,
        }
    }

    fn get_result(&self, acc: &(Option<String>, bool)) -> Option<String> {
        acc.0.clone().filter(|_| acc.1)
    }

    fn merge(
        &self,
        a: (Option<String>, bool),
        b: (Option<String>, bool),
    ) -> (Option<String>, bool) {
        (a.0.or(b.0), a.1 || b.1)
    }
}
