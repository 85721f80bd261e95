//! The three kinds of Nexmark event (nexmark-flink's `Person`, `Auction` and `Bid`), with
//! event times in milliseconds since the epoch.

use serde::{Deserialize, Serialize};

/// A person joining the auction site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// The person's id (from 1000).
    pub id: u64,
    /// First and last name.
    pub name: String,
    /// Email address.
    pub email_address: String,
    /// Credit card number, four groups of four digits.
    pub credit_card: String,
    /// US city.
    pub city: String,
    /// US state.
    pub state: String,
    /// Event time, ms.
    pub date_time: i64,
    /// Padding to the configured average size.
    pub extra: String,
}

/// An item put up for auction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// The auction's id (from 1000).
    pub id: u64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Starting price.
    pub initial_bid: u64,
    /// Reserve price (above the initial bid).
    pub reserve: u64,
    /// Event time, ms: when the auction opens.
    pub date_time: i64,
    /// When it closes, ms.
    pub expires: i64,
    /// The seller's person id.
    pub seller: u64,
    /// Category (10 to 14).
    pub category: u64,
    /// Padding to the configured average size.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    /// The auction bid on.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price, in cents.
    pub price: u64,
    /// Event time, ms.
    pub date_time: i64,
    /// Padding to the configured average size.
    pub extra: String,
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Event {
    /// The event's time, ms.
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}
