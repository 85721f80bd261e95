//! A plain, single-threaded reference of each Nexmark query, written without the engine: the
//! oracle the Weir jobs' results are judged against.
//!
//! Every query is computed over the whole input at once, in event time: every event counts,
//! nothing is late, and the order of the input does not matter. The result is the sorted
//! multiset of lines [`result_lines`] gives for the engine's rows of the same query.

use crate::generator::GeneratorConfig;
use crate::model::{Auction, Bid, Event, Person};
use crate::rows::{Query, Row, result_lines};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// q5's window size, ms.
const Q5_SIZE: i64 = 10_000;
/// q5's slide, ms.
const Q5_SLIDE: i64 = 2_000;
/// q7's and q8's tumbling window size, ms.
const TUMBLE: i64 = 10_000;
/// q11's session gap, ms.
const SESSION_GAP: i64 = 10_000;
/// q3's seller states.
const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];
/// q3's category.
const Q3_CATEGORY: u64 = 10;

/// The result of `query` over `events` (all of them, in any order), as sorted lines: what
/// `rows::result_lines` gives for the engine's rows of the same query.
pub fn run(query: Query, events: impl IntoIterator<Item = Event>) -> Vec<String> {
    let input = Input::split(events);
    let rows = match query {
        Query::Q0 => q0(input.bids),
        Query::Q1 => q1(input.bids),
        Query::Q2 => q2(&input.bids),
        Query::Q3 => q3(&input.persons, &input.auctions),
        Query::Q4 => q4(&input.auctions, &input.bids),
        Query::Q5 => q5(&input.bids),
        Query::Q7 => q7(input.bids),
        Query::Q8 => q8(&input.persons, &input.auctions),
        Query::Q11 => q11(&input.bids),
    };
    result_lines(query, rows.iter().map(ToString::to_string))
}

/// The events `0..count` of `config`, in order (a convenience over GeneratorConfig::event).
pub fn events(config: &GeneratorConfig, count: u64) -> impl Iterator<Item = Event> + '_ {
    (0..count).map(move |n| config.event(n))
}

/// The input, sorted by kind (each kind in input order, which no query depends on).
#[derive(Default)]
struct Input {
    persons: Vec<Person>,
    auctions: Vec<Auction>,
    bids: Vec<Bid>,
}

impl Input {
    fn split(events: impl IntoIterator<Item = Event>) -> Self {
        let mut input = Input::default();
        for event in events {
            match event {
                Event::Person(p) => input.persons.push(p),
                Event::Auction(a) => input.auctions.push(a),
                Event::Bid(b) => input.bids.push(b),
            }
        }
        input
    }
}

/// The start of the window of `size` ms, aligned to 0, that `ts` falls in (also for negative
/// times: `-1` is in `[-size, 0)`).
fn window_start(ts: i64, size: i64) -> i64 {
    ts - ts.rem_euclid(size)
}

/// q0: every bid.
fn q0(bids: Vec<Bid>) -> Vec<Row> {
    bids.into_iter().map(Row::Bid).collect()
}

/// q1: every bid, its price times 0.908 (kept exact as `price * 908` thousandths).
fn q1(bids: Vec<Bid>) -> Vec<Row> {
    bids.into_iter()
        .map(|b| Row::Q1 {
            auction: b.auction,
            bidder: b.bidder,
            price_milli: u128::from(b.price) * 908,
            date_time: b.date_time,
            extra: b.extra,
        })
        .collect()
}

/// q2: the bids on auctions whose id is a multiple of 123.
fn q2(bids: &[Bid]) -> Vec<Row> {
    bids.iter()
        .filter(|b| b.auction % 123 == 0)
        .map(|b| Row::Q2 {
            auction: b.auction,
            price: b.price,
        })
        .collect()
}

/// q3: every (auction in category 10, person in OR, ID or CA) pair with
/// `auction.seller == person.id`, whichever came first.
fn q3(persons: &[Person], auctions: &[Auction]) -> Vec<Row> {
    let mut sellers: HashMap<u64, Vec<&Person>> = HashMap::new();
    for p in persons {
        if Q3_STATES.contains(&p.state.as_str()) {
            sellers.entry(p.id).or_default().push(p);
        }
    }
    let mut rows = Vec::new();
    for a in auctions.iter().filter(|a| a.category == Q3_CATEGORY) {
        for p in sellers.get(&a.seller).into_iter().flatten() {
            rows.push(Row::Q3 {
                name: p.name.clone(),
                city: p.city.clone(),
                state: p.state.clone(),
                id: a.id,
            });
        }
    }
    rows
}

/// q4: per category, the average (integer division) over its auctions of each auction's
/// final price, the highest bid on it between its opening and its expiry, both inclusive.
/// Auctions without such a bid do not count. One row per category, version 1.
fn q4(auctions: &[Auction], bids: &[Bid]) -> Vec<Row> {
    let mut bids_on: HashMap<u64, Vec<&Bid>> = HashMap::new();
    for b in bids {
        bids_on.entry(b.auction).or_default().push(b);
    }
    // category -> (sum of final prices, number of auctions)
    let mut per_category: BTreeMap<u64, (u128, u128)> = BTreeMap::new();
    for a in auctions {
        let final_price = bids_on
            .get(&a.id)
            .into_iter()
            .flatten()
            .filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires)
            .map(|b| b.price)
            .max();
        if let Some(price) = final_price {
            let (sum, count) = per_category.entry(a.category).or_default();
            *sum += u128::from(price);
            *count += 1;
        }
    }
    per_category
        .into_iter()
        .map(|(category, (sum, count))| Row::Q4 {
            category,
            // An average of u64 prices is at most the largest of them: it fits.
            avg: u64::try_from(sum / count).unwrap_or(u64::MAX),
            version: 1,
        })
        .collect()
}

/// The starts of the q5 windows `[s, s + 10 s)` holding `ts`: the multiples `s` of 2 s with
/// `s <= ts < s + 10 s`, five of them (fewer only at the very bottom of time).
fn q5_windows(ts: i64) -> impl Iterator<Item = i64> {
    let last = window_start(ts, Q5_SLIDE);
    (0..Q5_SIZE / Q5_SLIDE)
        .filter_map(move |k| last.checked_sub(k * Q5_SLIDE))
        .filter(move |&s| s <= ts && ts - s < Q5_SIZE)
}

/// q5: per 10 s window sliding by 2 s, the auctions with the most bids in it (all of them on a
/// tie).
fn q5(bids: &[Bid]) -> Vec<Row> {
    // window start -> auction -> bids
    let mut counts: BTreeMap<i64, HashMap<u64, u64>> = BTreeMap::new();
    for b in bids {
        for s in q5_windows(b.date_time) {
            *counts.entry(s).or_default().entry(b.auction).or_default() += 1;
        }
    }
    let mut rows = Vec::new();
    for (window_start, per_auction) in counts {
        let most = per_auction.values().copied().max().unwrap_or(0);
        for (&auction, &num) in &per_auction {
            if num == most {
                rows.push(Row::Q5 {
                    window_start,
                    auction,
                    num,
                });
            }
        }
    }
    rows
}

/// q7: per 10 s tumbling window with a bid, its highest price `max` and end `end`; then every
/// bid at price `max` with `end - 10 s <= date_time <= end`, once per window it matches. The
/// end is inclusive: a bid at exactly `end` (which is in the next window) also matches this
/// window if its price is this window's `max`.
fn q7(bids: Vec<Bid>) -> Vec<Row> {
    // window start -> highest price of the bids in the window
    let mut max_price: HashMap<i64, u64> = HashMap::new();
    for b in &bids {
        let max = max_price
            .entry(window_start(b.date_time, TUMBLE))
            .or_default();
        *max = (*max).max(b.price);
    }
    let mut rows = Vec::new();
    for b in bids {
        // The windows `[start, start + 10 s]` (closed) holding the bid: its own, and the one
        // before when it is exactly at that one's end.
        let own = window_start(b.date_time, TUMBLE);
        let before = (b.date_time == own)
            .then(|| own.checked_sub(TUMBLE))
            .flatten();
        let matches = [Some(own), before]
            .into_iter()
            .flatten()
            .filter(|start| max_price.get(start) == Some(&b.price))
            .count();
        for _ in 0..matches {
            rows.push(Row::Bid(b.clone()));
        }
    }
    rows
}

/// q8: the distinct (person id, name, window) of people who joined in a 10 s tumbling window
/// in which they also opened an auction (as its seller).
fn q8(persons: &[Person], auctions: &[Auction]) -> Vec<Row> {
    let joined: BTreeSet<(u64, &str, i64)> = persons
        .iter()
        .map(|p| (p.id, p.name.as_str(), window_start(p.date_time, TUMBLE)))
        .collect();
    let sold: HashSet<(u64, i64)> = auctions
        .iter()
        .map(|a| (a.seller, window_start(a.date_time, TUMBLE)))
        .collect();
    joined
        .into_iter()
        .filter(|(id, _, start)| sold.contains(&(*id, *start)))
        .map(|(id, name, window_start)| Row::Q8 {
            id,
            name: name.to_string(),
            window_start,
        })
        .collect()
}

/// q11: per bidder, sessions of bids no more than 10 s apart (a gap of exactly 10 s joins two
/// sessions, as Flink's `TimeWindow.intersects` merges touching windows): the count, the first
/// bid's time, and the last bid's time plus 10 s.
fn q11(bids: &[Bid]) -> Vec<Row> {
    let mut times: HashMap<u64, Vec<i64>> = HashMap::new();
    for b in bids {
        times.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut rows = Vec::new();
    for (bidder, mut ts) in times {
        ts.sort_unstable();
        let mut session: Option<(i64, i64, u64)> = None; // (first, last, count)
        for t in ts {
            session = match session {
                Some((first, last, count)) if t - last <= SESSION_GAP => {
                    Some((first, t, count + 1))
                }
                Some(done) => {
                    rows.push(q11_row(bidder, done));
                    Some((t, t, 1))
                }
                None => Some((t, t, 1)),
            };
        }
        if let Some(done) = session {
            rows.push(q11_row(bidder, done));
        }
    }
    rows
}

fn q11_row(bidder: u64, (first, last, count): (i64, i64, u64)) -> Row {
    Row::Q11 {
        bidder,
        bid_count: count,
        session_start: first,
        session_end: last.saturating_add(SESSION_GAP),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn bid(auction: u64, bidder: u64, price: u64, date_time: i64) -> Event {
        Event::Bid(Bid {
            auction,
            bidder,
            price,
            date_time,
            extra: "x".to_string(),
        })
    }

    fn person(id: u64, name: &str, state: &str, date_time: i64) -> Event {
        Event::Person(Person {
            id,
            name: name.to_string(),
            email_address: "e@f.com".to_string(),
            credit_card: "0000 0000 0000 0000".to_string(),
            city: format!("City{id}"),
            state: state.to_string(),
            date_time,
            extra: String::new(),
        })
    }

    fn auction(id: u64, seller: u64, category: u64, date_time: i64, expires: i64) -> Event {
        Event::Auction(Auction {
            id,
            item_name: "item".to_string(),
            description: "desc".to_string(),
            initial_bid: 1,
            reserve: 2,
            date_time,
            expires,
            seller,
            category,
            extra: String::new(),
        })
    }

    fn sorted(lines: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn q0_q1_q2_pass_convert_and_select_bids() {
        let input = vec![bid(246, 1, 1, 5), bid(247, 2, 1234, 6), bid(246, 3, 7, 7)];
        assert_eq!(
            run(Query::Q0, input.clone()),
            sorted(&["246,1,1,5,x", "247,2,1234,6,x", "246,3,7,7,x"])
        );
        assert_eq!(
            run(Query::Q1, input.clone()),
            sorted(&["246,1,0.908,5,x", "247,2,1120.472,6,x", "246,3,6.356,7,x"])
        );
        assert_eq!(run(Query::Q2, input), sorted(&["246,1", "246,7"]));
    }

    #[test]
    fn q3_filters_states_and_category_and_joins_a_late_seller() {
        let input = vec![
            person(1, "Ann", "OR", 0),
            person(2, "Bob", "WA", 0),
            auction(10, 1, 10, 1, 2), // match
            auction(11, 1, 11, 1, 2), // wrong category
            auction(12, 2, 10, 1, 2), // seller in WA
            auction(13, 3, 10, 1, 2), // seller joins later: still a match
            auction(14, 9, 10, 1, 2), // no such person
            auction(15, 4, 10, 1, 2), // match
            person(3, "Cid", "CA", 5),
            person(4, "Dee", "ID", 5),
        ];
        let expected = sorted(&["Ann,City1,OR,10", "Cid,City3,CA,13", "Dee,City4,ID,15"]);
        assert_eq!(run(Query::Q3, input.clone()), expected);
        assert_eq!(run(Query::Q3, input.into_iter().rev()), expected);
    }

    #[test]
    fn q4_counts_bids_from_opening_to_expiry_inclusive_and_averages_by_integer_division() {
        let input = vec![
            auction(1, 100, 10, 1000, 2000),
            bid(1, 5, 100, 999), // before the opening
            bid(1, 5, 7, 1000),  // at the opening
            bid(1, 5, 3, 1500),
            bid(1, 5, 9, 2000),  // at the expiry: the final price
            bid(1, 5, 50, 2001), // after the expiry
            auction(2, 100, 10, 0, 100),
            bid(2, 5, 4, 50),
            auction(3, 100, 11, 0, 100),
            bid(3, 5, 80, 101), // too late: auction 3 and category 11 do not count
            auction(4, 100, 12, 0, 100),
            bid(4, 5, 5, 0),
            bid(99, 5, 1000, 0), // no such auction
        ];
        // Category 10: (9 + 4) / 2 = 6; category 12: 5.
        let expected = sorted(&["10,6", "12,5"]);
        assert_eq!(run(Query::Q4, input.clone()), expected);
        assert_eq!(run(Query::Q4, input.into_iter().rev()), expected);
    }

    #[test]
    fn q5_puts_a_bid_in_five_windows() {
        assert_eq!(
            run(Query::Q5, vec![bid(7, 1, 1, 9000)]),
            sorted(&["0,7,1", "2000,7,1", "4000,7,1", "6000,7,1", "8000,7,1"])
        );
        assert_eq!(
            run(Query::Q5, vec![bid(7, 1, 1, -1)]),
            sorted(&[
                "-10000,7,1",
                "-8000,7,1",
                "-6000,7,1",
                "-4000,7,1",
                "-2000,7,1"
            ])
        );
    }

    #[test]
    fn q5_keeps_every_auction_tied_for_the_most_bids() {
        let input = vec![
            bid(1, 1, 1, 0),
            bid(1, 1, 1, 1),
            bid(2, 1, 1, 2),
            bid(2, 1, 1, 3),
            bid(3, 1, 1, 4),
            bid(3, 1, 1, 2000),
        ];
        // [-8000, 2000) holds all but the bid at 2000: auctions 1 and 2 tie at 2.
        // [-6000, 4000) … [0, 10000) hold all six: 1, 2 and 3 tie at 2.
        // [2000, 12000) holds only the bid at 2000.
        let expected = sorted(&[
            "-8000,1,2",
            "-8000,2,2",
            "-6000,1,2",
            "-6000,2,2",
            "-6000,3,2",
            "-4000,1,2",
            "-4000,2,2",
            "-4000,3,2",
            "-2000,1,2",
            "-2000,2,2",
            "-2000,3,2",
            "0,1,2",
            "0,2,2",
            "0,3,2",
            "2000,3,1",
        ]);
        assert_eq!(run(Query::Q5, input.clone()), expected);
        assert_eq!(run(Query::Q5, input.into_iter().rev()), expected);
    }

    #[test]
    fn q7_a_bid_at_the_end_also_matches_the_window_before() {
        // [0, 10000) has max 5; the bid at 10000 at price 5 is also [10000, 20000)'s max.
        let input = vec![
            bid(1, 1, 5, 3000),
            bid(2, 2, 5, 10_000),
            bid(3, 3, 2, 15_000),
        ];
        assert_eq!(
            run(Query::Q7, input),
            sorted(&["1,1,5,3000,x", "2,2,5,10000,x", "2,2,5,10000,x"])
        );
    }

    #[test]
    fn q7_a_bid_at_the_end_below_its_own_windows_max_matches_only_the_window_before() {
        let input = vec![
            bid(1, 1, 5, 0), // in [0, 10000) only: [-10000, 0) has no bid
            bid(2, 2, 5, 10_000),
            bid(3, 3, 9, 12_000),
            bid(4, 4, 1, 19_999),
        ];
        let expected = sorted(&["1,1,5,0,x", "2,2,5,10000,x", "3,3,9,12000,x"]);
        assert_eq!(run(Query::Q7, input.clone()), expected);
        assert_eq!(run(Query::Q7, input.into_iter().rev()), expected);
    }

    #[test]
    fn q8_names_each_person_once_per_window_they_joined_and_sold_in() {
        let input = vec![
            person(1, "Ann", "OR", 1000),
            person(1, "Ann", "OR", 1000), // the same again: still once
            person(2, "Bob", "WA", 1000),
            person(3, "Cid", "CA", 9000),
            auction(10, 1, 10, 2000, 3000),
            auction(11, 1, 11, 5000, 6000), // Ann's second auction in the window
            auction(12, 2, 10, 10_000, 11_000), // Bob sells in the next window only
            auction(13, 3, 10, 9999, 11_000),
            auction(14, 5, 10, 1000, 2000), // no such person
        ];
        let expected = sorted(&["1,Ann,0", "3,Cid,0"]);
        assert_eq!(run(Query::Q8, input.clone()), expected);
        assert_eq!(run(Query::Q8, input.into_iter().rev()), expected);
    }

    #[test]
    fn q11_merges_sessions_exactly_the_gap_apart_and_splits_one_ms_more() {
        let input = vec![
            bid(1, 1, 1, 20_000),
            bid(1, 1, 1, 0),
            bid(1, 1, 1, 10_000), // 10000 after 0 and before 20000: one session
            bid(1, 2, 1, 0),
            bid(1, 2, 1, 10_001), // 10001 after: a new session
        ];
        let expected = sorted(&["1,3,0,30000", "2,1,0,10000", "2,1,10001,20001"]);
        assert_eq!(run(Query::Q11, input.clone()), expected);
        assert_eq!(run(Query::Q11, input.into_iter().rev()), expected);
    }

    #[test]
    fn generated_events_give_every_query_a_result_whatever_their_order() {
        let config = GeneratorConfig {
            event_rate: 1_000,
            ..Default::default()
        };
        let all: Vec<Event> = events(&config, 20_000).collect();
        assert_eq!(all.len(), 20_000);
        for query in Query::ALL {
            let lines = run(query, all.clone());
            assert!(!lines.is_empty(), "{query} gave nothing");
            assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{query} unsorted");
            let reversed = run(query, all.iter().rev().cloned());
            assert_eq!(lines, reversed, "{query} depends on the input order");
            if matches!(query, Query::Q0 | Query::Q1) {
                // 46 bids in every 50 events.
                assert_eq!(lines.len(), 18_400, "{query}");
            }
            if query == Query::Q4 {
                // Categories 10 to 14, each with auctions that had bids.
                assert_eq!(lines.len(), 5, "{lines:?}");
            }
        }
    }
}
