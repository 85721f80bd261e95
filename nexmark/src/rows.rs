//! The queries, their result rows and the lines a result is written as: the same for the Weir
//! jobs and for the reference, so that the two compare line by line.

use crate::model::Bid;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A Nexmark query (nexmark-flink's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Query {
    /// Pass-through: every bid.
    Q0,
    /// Currency conversion: every bid, its price times 0.908.
    Q1,
    /// Selection: bids on auctions whose id is a multiple of 123.
    Q2,
    /// Local item suggestion: sellers in OR, ID or CA of auctions in category 10 (a join).
    Q3,
    /// Average winning price per category (a join and two aggregations, updating).
    Q4,
    /// Hot items: per 10 s window sliding by 2 s, the auctions with the most bids.
    Q5,
    /// Highest bid: per 10 s tumbling window, the bids at the window's highest price.
    Q7,
    /// Monitor new users: people who created an auction in the 10 s window they joined in.
    Q8,
    /// User sessions: bids per bidder per session (10 s gap).
    Q11,
}

impl Query {
    /// Every query, in order.
    pub const ALL: [Query; 9] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q7,
        Query::Q8,
        Query::Q11,
    ];

    /// Its name, `q0` … `q11`.
    pub fn name(self) -> &'static str {
        match self {
            Query::Q0 => "q0",
            Query::Q1 => "q1",
            Query::Q2 => "q2",
            Query::Q3 => "q3",
            Query::Q4 => "q4",
            Query::Q5 => "q5",
            Query::Q7 => "q7",
            Query::Q8 => "q8",
            Query::Q11 => "q11",
        }
    }

    /// Its output columns, comma-separated, as a line of its result has them.
    pub fn columns(self) -> &'static str {
        match self {
            Query::Q0 | Query::Q7 => "auction,bidder,price,date_time,extra",
            Query::Q1 => "auction,bidder,price_eur,date_time,extra",
            Query::Q2 => "auction,price",
            Query::Q3 => "name,city,state,auction_id",
            Query::Q4 => "category,avg_final_price",
            Query::Q5 => "window_start,auction,num",
            Query::Q8 => "id,name,window_start",
            Query::Q11 => "bidder,bid_count,session_start,session_end",
        }
    }
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Query {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Query::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown query '{s}': expected one of q0, q1, q2, q3, q4, q5, q7, q8, q11")
            })
    }
}

/// One row of a query's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Row {
    /// q0, q7: a bid as it came.
    Bid(Bid),
    /// q1: a bid with its price in euros, in thousandths of a cent (`price * 908`).
    Q1 {
        /// The auction.
        auction: u64,
        /// The bidder.
        bidder: u64,
        /// `price * 908`: the converted price times 1000, exact.
        price_milli: u128,
        /// Event time, ms.
        date_time: i64,
        /// The bid's padding.
        extra: String,
    },
    /// q2.
    Q2 {
        /// The auction (a multiple of 123).
        auction: u64,
        /// The bid's price.
        price: u64,
    },
    /// q3.
    Q3 {
        /// The seller's name.
        name: String,
        /// The seller's city.
        city: String,
        /// The seller's state.
        state: String,
        /// The auction.
        id: u64,
    },
    /// q4: one update of a category's average; the result is each category's latest.
    Q4 {
        /// The category.
        category: u64,
        /// The average of its auctions' winning prices (integer division, as SQL's AVG of a
        /// BIGINT).
        avg: u64,
        /// The update's number within its category (1, 2, …): the largest is the latest.
        version: u64,
    },
    /// q5.
    Q5 {
        /// The window's start, ms.
        window_start: i64,
        /// An auction with the window's most bids.
        auction: u64,
        /// Its bids in the window.
        num: u64,
    },
    /// q8.
    Q8 {
        /// The person.
        id: u64,
        /// Their name.
        name: String,
        /// The window's start, ms.
        window_start: i64,
    },
    /// q11.
    Q11 {
        /// The bidder.
        bidder: u64,
        /// Bids in the session.
        bid_count: u64,
        /// The session's first bid's time, ms.
        session_start: i64,
        /// Its last bid's time plus the gap, ms.
        session_end: i64,
    },
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Row::Bid(b) => write!(
                f,
                "{},{},{},{},{}",
                b.auction, b.bidder, b.price, b.date_time, b.extra
            ),
            Row::Q1 {
                auction,
                bidder,
                price_milli,
                date_time,
                extra,
            } => write!(
                f,
                "{auction},{bidder},{}.{:03},{date_time},{extra}",
                price_milli / 1000,
                price_milli % 1000
            ),
            Row::Q2 { auction, price } => write!(f, "{auction},{price}"),
            Row::Q3 {
                name,
                city,
                state,
                id,
            } => write!(f, "{name},{city},{state},{id}"),
            Row::Q4 {
                category,
                avg,
                version,
            } => write!(f, "{category},{avg},{version}"),
            Row::Q5 {
                window_start,
                auction,
                num,
            } => write!(f, "{window_start},{auction},{num}"),
            Row::Q8 {
                id,
                name,
                window_start,
            } => write!(f, "{id},{name},{window_start}"),
            Row::Q11 {
                bidder,
                bid_count,
                session_start,
                session_end,
            } => write!(f, "{bidder},{bid_count},{session_start},{session_end}"),
        }
    }
}

/// The result of `query` from the lines its rows were written as, sorted: for q4, an updating
/// query, each category's latest average (`category,avg`); for the others every line.
pub fn result_lines(query: Query, lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = if query == Query::Q4 {
        let mut latest: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for line in lines {
            let f: Vec<u64> = line.split(',').filter_map(|x| x.parse().ok()).collect();
            if let [category, avg, version] = f[..] {
                let e = latest.entry(category).or_insert((0, avg));
                if version >= e.0 {
                    *e = (version, avg);
                }
            }
        }
        latest
            .into_iter()
            .map(|(c, (_, avg))| format!("{c},{avg}"))
            .collect()
    } else {
        lines.into_iter().collect()
    };
    out.sort();
    out
}
