//! nexmark-flink's event generator made a pure function of `(seed, event number)`: the same
//! proportions (1 person : 3 auctions : 46 bids), id rules (hot sellers, bidders and auctions,
//! a few ids of people and auctions not yet created), price distribution and string sizes, and
//! event time from the generator's own clock (`base_time + n / rate`), so that any split of the
//! event numbers, at any parallelism, after any restore, yields the same events.

use crate::model::{Auction, Bid, Event, Person};
use weir_core::splitmix::{GOLDEN_GAMMA, SplitMix, splitmix64};

/// Ids start here, so that queries find matches even on few events (nexmark-flink's
/// `FIRST_AUCTION_ID`, `FIRST_PERSON_ID`).
pub const FIRST_AUCTION_ID: u64 = 1000;
/// The first person id.
pub const FIRST_PERSON_ID: u64 = 1000;
/// The first category; there are [`NUM_CATEGORIES`].
pub const FIRST_CATEGORY_ID: u64 = 10;
/// Categories are `10..15`.
pub const NUM_CATEGORIES: u64 = 5;
/// Ids of people and auctions not yet created that a bid or auction may name.
const ID_LEAD: u64 = 10;
/// Hot sellers, bidders and auctions are the first of each batch of this many.
const HOT_BATCH: u64 = 100;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];

/// What the generator makes: nexmark-flink's `NexmarkConfiguration` defaults but for the
/// seed, the event count, the rate and the base time, which are its flags.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratorConfig {
    /// Seeds every event's random draws.
    pub seed: u64,
    /// Events in all (`None`: unbounded).
    pub events: Option<u64>,
    /// Events per second of event time (nexmark-flink's `first-event.rate`, its benchmark's
    /// `TPS` of 10,000,000): event `n` happens at `base_time + n * 1000 / rate` ms.
    pub event_rate: u64,
    /// Event time of the first event, ms since the epoch.
    pub base_time: i64,
    /// Of every `person + auction + bid` events, this many are people…
    pub person_proportion: u64,
    /// …this many auctions…
    pub auction_proportion: u64,
    /// …and this many bids.
    pub bid_proportion: u64,
    /// One in this many bids is for a random auction, the rest for a hot one.
    pub hot_auction_ratio: u64,
    /// One in this many auctions is by a random seller, the rest by a hot one.
    pub hot_sellers_ratio: u64,
    /// One in this many bids is by a random bidder, the rest by a hot one.
    pub hot_bidders_ratio: u64,
    /// People a random seller or bidder is drawn from (the most recent).
    pub num_active_people: u64,
    /// Auctions a random bid is for (the most recent); also sets auction lengths.
    pub num_in_flight_auctions: u64,
    /// Average size of a person, bytes (the `extra` field pads to it).
    pub avg_person_byte_size: u64,
    /// Average size of an auction, bytes.
    pub avg_auction_byte_size: u64,
    /// Average size of a bid, bytes.
    pub avg_bid_byte_size: u64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            seed: 0,
            events: Some(10_000_000),
            event_rate: 10_000_000,
            // 2026-01-01T00:00:00Z: fixed, so that every run sees the same events.
            base_time: 1_767_225_600_000,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            num_active_people: 1000,
            num_in_flight_auctions: 100,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
        }
    }
}

/// The random draws of one event: SplitMix64 seeded by the config's seed and the event number.
struct Draws(SplitMix);

impl Draws {
    fn new(seed: u64, event: u64) -> Self {
        Draws(SplitMix(splitmix64(
            seed ^ event.wrapping_mul(GOLDEN_GAMMA).rotate_left(17),
        )))
    }

    /// A number in `0..n` (`n` ≥ 1).
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n.max(1))
    }

    /// A number in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// nexmark-flink's `PriceGenerator.nextPrice`: `10^(6u) * 100` cents, rounded.
    fn price(&mut self) -> u64 {
        (10f64.powf(self.unit() * 6.0) * 100.0).round() as u64
    }

    /// `StringsGenerator.nextString`: 3 to `max - 1` letters, about one in 13 a space, trimmed.
    fn string(&mut self, max: u64) -> String {
        let len = 3 + self.below(max - 3);
        let mut s = String::with_capacity(len as usize);
        for _ in 0..len {
            if self.below(13) == 0 {
                s.push(' ');
            } else {
                s.push(char::from(b'a' + self.below(26) as u8));
            }
        }
        s.trim().to_string()
    }

    /// `StringsGenerator.nextExactString`: `len` letters, six from each draw.
    fn exact_string(&mut self, len: u64) -> String {
        let mut s = String::with_capacity(len as usize);
        let (mut rnd, mut left) = (0u64, 0);
        for _ in 0..len {
            if left == 0 {
                rnd = self.0.next_u64() >> 33;
                left = 6;
            }
            s.push(char::from(b'a' + (rnd % 26) as u8));
            rnd /= 26;
            left -= 1;
        }
        s
    }

    /// `StringsGenerator.nextExtra`: padding so that `current + len` averages `average`, ±20 %.
    fn extra(&mut self, current: u64, average: u64) -> String {
        if current > average {
            return String::new();
        }
        let want = average - current;
        let delta = (want as f64 * 0.2).round() as u64;
        let size = want - delta + if delta == 0 { 0 } else { self.below(2 * delta) };
        self.exact_string(size)
    }
}

impl GeneratorConfig {
    /// Checks the settings, naming the first that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("event rate", self.event_rate),
            ("person proportion", self.person_proportion),
            ("auction proportion", self.auction_proportion),
            ("hot auction ratio", self.hot_auction_ratio),
            ("hot sellers ratio", self.hot_sellers_ratio),
            ("hot bidders ratio", self.hot_bidders_ratio),
            ("active people", self.num_active_people),
            ("auctions in flight", self.num_in_flight_auctions),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("the generator's {name} must be at least 1"));
            }
        }
        self.total_proportion()
            .ok_or_else(|| "the generator's proportions add up past 2^64".to_string())?;
        Ok(())
    }

    fn total_proportion(&self) -> Option<u64> {
        self.person_proportion
            .checked_add(self.auction_proportion)?
            .checked_add(self.bid_proportion)
    }

    fn total(&self) -> u64 {
        self.total_proportion().unwrap_or(u64::MAX).max(1)
    }

    /// Event time of event `n`, ms (saturating at the end of time).
    pub fn timestamp(&self, n: u64) -> i64 {
        let offset = u128::from(n) * 1000 / u128::from(self.event_rate.max(1));
        i64::try_from(i128::from(self.base_time) + offset as i128).unwrap_or(i64::MAX)
    }

    /// The last person id created by event `n` (base 0): `n`'s own if it is a person.
    fn last_base0_person_id(&self, n: u64) -> u64 {
        let (epoch, offset) = (n / self.total(), n % self.total());
        let offset = offset.min(self.person_proportion - 1);
        epoch
            .wrapping_mul(self.person_proportion)
            .wrapping_add(offset)
    }

    /// The last auction id created by event `n` (base 0): `n`'s own if it is an auction.
    fn last_base0_auction_id(&self, n: u64) -> u64 {
        let (mut epoch, mut offset) = (n / self.total(), n % self.total());
        if offset < self.person_proportion {
            // A person: the last auction of the epoch before.
            epoch = epoch.wrapping_sub(1);
            offset = self.auction_proportion - 1;
        } else if offset >= self.person_proportion + self.auction_proportion {
            // A bid: the last auction of this epoch.
            offset = self.auction_proportion - 1;
        } else {
            offset -= self.person_proportion;
        }
        epoch
            .wrapping_mul(self.auction_proportion)
            .wrapping_add(offset)
    }

    /// A random active person (base 0), or one of the next few not yet created.
    fn next_base0_person_id(&self, n: u64, d: &mut Draws) -> u64 {
        let people = self.last_base0_person_id(n).saturating_add(1);
        let active = people.min(self.num_active_people);
        people - active + d.below(active.saturating_add(ID_LEAD))
    }

    /// A random auction in flight (base 0), or one of the next few not yet created.
    fn next_base0_auction_id(&self, n: u64, d: &mut Draws) -> u64 {
        let last = self.last_base0_auction_id(n);
        // Before the first auction `last` wraps below 0: count from 0.
        let last = if last > n { 0 } else { last };
        let min = last.saturating_sub(self.num_in_flight_auctions);
        min + d.below((last - min).saturating_add(1 + ID_LEAD))
    }

    /// Event `n`.
    pub fn event(&self, n: u64) -> Event {
        let mut d = Draws::new(self.seed, n);
        let ts = self.timestamp(n);
        let rem = n % self.total();
        if rem < self.person_proportion {
            Event::Person(self.person(n, ts, &mut d))
        } else if rem < self.person_proportion + self.auction_proportion {
            Event::Auction(self.auction(n, ts, &mut d))
        } else {
            Event::Bid(self.bid(n, ts, &mut d))
        }
    }

    fn person(&self, n: u64, ts: i64, d: &mut Draws) -> Person {
        let id = self.last_base0_person_id(n).wrapping_add(FIRST_PERSON_ID);
        let name = format!(
            "{} {}",
            FIRST_NAMES[d.below(FIRST_NAMES.len() as u64) as usize],
            LAST_NAMES[d.below(LAST_NAMES.len() as u64) as usize]
        );
        let email_address = format!("{}@{}.com", d.string(7), d.string(5));
        let credit_card = format!(
            "{:04} {:04} {:04} {:04}",
            d.below(10_000),
            d.below(10_000),
            d.below(10_000),
            d.below(10_000)
        );
        let city = US_CITIES[d.below(US_CITIES.len() as u64) as usize].to_string();
        let state = US_STATES[d.below(US_STATES.len() as u64) as usize].to_string();
        let size = 8 + name.len() + email_address.len() + credit_card.len() + city.len();
        let extra = d.extra((size + state.len()) as u64, self.avg_person_byte_size);
        Person {
            id,
            name,
            email_address,
            credit_card,
            city,
            state,
            date_time: ts,
            extra,
        }
    }

    fn auction(&self, n: u64, ts: i64, d: &mut Draws) -> Auction {
        let id = self.last_base0_auction_id(n).wrapping_add(FIRST_AUCTION_ID);
        let seller = if d.below(self.hot_sellers_ratio) > 0 {
            (self.last_base0_person_id(n) / HOT_BATCH) * HOT_BATCH
        } else {
            self.next_base0_person_id(n, d)
        }
        .wrapping_add(FIRST_PERSON_ID);
        let category = FIRST_CATEGORY_ID + d.below(NUM_CATEGORIES);
        let initial_bid = d.price();
        // Auctions last on average until `num_in_flight_auctions` more have been created.
        let events_for_auctions =
            self.num_in_flight_auctions.saturating_mul(self.total()) / self.auction_proportion;
        let horizon = self.timestamp(n.saturating_add(events_for_auctions)) - ts;
        let length = d.below((horizon.max(0) as u64).saturating_mul(2).max(1));
        let expires = ts.saturating_add(length.min(i64::MAX as u64 - 1) as i64 + 1);
        let item_name = d.string(20);
        let description = d.string(100);
        let reserve = initial_bid.saturating_add(d.price());
        let size = 8 + item_name.len() + description.len() + 40;
        let extra = d.extra(size as u64, self.avg_auction_byte_size);
        Auction {
            id,
            item_name,
            description,
            initial_bid,
            reserve,
            date_time: ts,
            expires,
            seller,
            category,
            extra,
        }
    }

    fn bid(&self, n: u64, ts: i64, d: &mut Draws) -> Bid {
        let auction = if d.below(self.hot_auction_ratio) > 0 {
            (self.last_base0_auction_id(n) / HOT_BATCH) * HOT_BATCH
        } else {
            self.next_base0_auction_id(n, d)
        }
        .wrapping_add(FIRST_AUCTION_ID);
        let bidder = if d.below(self.hot_bidders_ratio) > 0 {
            // The second of the batch, so that hot bidders and hot sellers differ.
            (self.last_base0_person_id(n) / HOT_BATCH) * HOT_BATCH + 1
        } else {
            self.next_base0_person_id(n, d)
        }
        .wrapping_add(FIRST_PERSON_ID);
        let price = d.price();
        let extra = d.extra(32, self.avg_bid_byte_size);
        Bid {
            auction,
            bidder,
            price,
            date_time: ts,
            extra,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportions_ids_and_time_follow_nexmark_flink() {
        let c = GeneratorConfig {
            event_rate: 1_000,
            ..GeneratorConfig::default()
        };
        let (mut people, mut auctions, mut bids) = (0, 0, 0);
        for n in 0..5_000u64 {
            let e = c.event(n);
            assert_eq!(
                e.date_time(),
                c.base_time + n as i64,
                "1 ms per event at 1000/s"
            );
            match e {
                Event::Person(p) => {
                    assert_eq!(p.id, FIRST_PERSON_ID + people);
                    assert!(US_STATES.contains(&p.state.as_str()));
                    people += 1;
                }
                Event::Auction(a) => {
                    assert_eq!(a.id, FIRST_AUCTION_ID + auctions);
                    assert!((10..15).contains(&a.category));
                    assert!(a.expires > a.date_time && a.reserve > a.initial_bid);
                    // A seller exists or is one of the next few people.
                    assert!(a.seller < FIRST_PERSON_ID + people + ID_LEAD);
                    auctions += 1;
                }
                Event::Bid(b) => {
                    assert!((100..=100_000_000).contains(&b.price), "{}", b.price);
                    assert!(b.auction < FIRST_AUCTION_ID + auctions + ID_LEAD);
                    assert!(b.bidder < FIRST_PERSON_ID + people + ID_LEAD);
                    bids += 1;
                }
            }
        }
        assert_eq!((people, auctions, bids), (100, 300, 4_600));
    }

    #[test]
    fn an_event_depends_on_the_seed_and_its_number_alone() {
        let c = GeneratorConfig::default();
        let other = GeneratorConfig {
            seed: 1,
            ..GeneratorConfig::default()
        };
        assert_eq!(c.event(12_345), c.event(12_345));
        assert_ne!(c.event(12_345), other.event(12_345));
        // Bids pad to about 100 bytes, auctions to 500.
        let sizes: Vec<usize> = (0..1_000)
            .filter_map(|n| match c.event(n) {
                Event::Bid(b) => Some(32 + b.extra.len()),
                _ => None,
            })
            .collect();
        let mean = sizes.iter().sum::<usize>() / sizes.len();
        assert!((90..=110).contains(&mean), "{mean}");
    }

    #[test]
    fn bad_settings_are_named() {
        let c = GeneratorConfig {
            event_rate: 0,
            ..GeneratorConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("event rate"));
        let c = GeneratorConfig {
            bid_proportion: u64::MAX,
            ..GeneratorConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("proportions"));
        // Extreme but valid: no panic.
        let c = GeneratorConfig {
            event_rate: 1,
            base_time: i64::MAX - 5,
            ..GeneratorConfig::default()
        };
        assert_eq!(c.event(u64::MAX - 1).date_time(), i64::MAX);
    }
}
