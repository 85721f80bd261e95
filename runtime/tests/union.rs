//! Two inputs. `union`: the next operator reads every input's records exactly once (under
//! failures too, at mixed parallelisms), its watermark is the minimum over the inputs, so
//! event-time windows over a union hold both sides' records; a stream unioned with itself is
//! refused at build time. `connect` + `key_by` + a `KeyedCoProcessFunction`: both sides of a key
//! share its state and timers, exactly once under failures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::BTreeMap;
use std::time::Duration;
use support::{Failures, inject};
use weir_runtime::co::KeyedCoProcessFunction;
use weir_runtime::keyed::{Collector, KeyedContext, KeyedStateRegistry, TimeDomain};
use weir_runtime::window::{TimeWindow, TumblingEventTimeWindows};
use weir_runtime::{JobError, RestartStrategy, StreamEnvironment, TaskError, ValueState};

const LEFT: u64 = 30_000;
const RIGHT: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_union_of_two_sources_at_other_parallelisms_counts_every_record_once_under_failures() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        });
    env.set_checkpoint_dir(tempfile::tempdir().unwrap().keep());
    let failures = Failures::paced(vec![LEFT / 2], 1_000);
    let left = env
        .from_generator(Some(LEFT), |i| (i % 7, 1i64))
        .uid("left");
    let right = env
        .from_generator(Some(RIGHT), |i| (i % 5, 10i64))
        .uid("right")
        .set_parallelism(1);
    let totals = inject(left.union(vec![right]), &failures)
        .uid("union")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    let mut want: BTreeMap<u64, i64> = BTreeMap::new();
    for i in 0..LEFT {
        *want.entry(i % 7).or_default() += 1;
    }
    for i in 0..RIGHT {
        *want.entry(i % 5).or_default() += 10;
    }
    assert_eq!(totals.get(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_time_windows_over_a_union_wait_for_the_slower_input() {
    // The left side runs far ahead in event time (and ends first); the right side is slow.
    // The union's watermark is the minimum, so no window fires before the right side's
    // records for it arrived: each window holds both sides' records.
    let env = StreamEnvironment::new();
    env.set_parallelism(1);
    env.config_mut().batch_size = 16;
    let left = env
        .from_collection((0..2_000i64).map(|t| (0u64, t)).collect())
        .assign_timestamps_and_watermarks(Duration::ZERO, |r: &(u64, i64)| r.1);
    let right = env
        .from_collection((0..2_000i64).map(|t| (0u64, t)).collect())
        .map(|r: (u64, i64)| {
            if r.1.rem_euclid(100) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            r
        })
        .assign_timestamps_and_watermarks(Duration::ZERO, |r: &(u64, i64)| r.1);
    let counts = left
        .union(vec![right])
        .key_by(|r: &(u64, i64)| &r.0)
        .window(TumblingEventTimeWindows::of(Duration::from_millis(100)))
        .timestamps(|r: &(u64, i64)| r.1)
        .side_output_late_data();
    let (results, late) = counts.reduce_with(
        |a: &(u64, i64), _: &(u64, i64)| (a.0 + 1, a.1),
        |_: &u64, w: &TimeWindow, r: (u64, i64)| (w.start, r.0),
    );
    let results = results.collect();
    let late = late.collect();
    env.execute().bounded().await.unwrap();
    // The reduce counts records after the first (whose key 0 starts the count): 200 records
    // per window, 100 from each side.
    let want: Vec<(i64, u64)> = (0..20).map(|w| (w * 100, 199)).collect();
    let mut got = results.records();
    got.sort();
    assert_eq!(got, want);
    assert!(late.records().is_empty(), "{:?}", late.records());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_unioned_with_itself_is_refused_at_build_time() {
    let env = StreamEnvironment::new();
    let s = env.from_collection(vec![1u64, 2, 3]);
    let _ = s.clone().union(vec![s]).collect();
    match env.execute().bounded().await {
        Err(JobError::Invalid(msg)) => assert!(msg.contains("the same stream twice"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// connect: orders and payments joined per order id, with a timeout timer.
// ---------------------------------------------------------------------------------------------

const ORDERS: u64 = 6_000;
/// An order is reported unpaid when no payment came this long (event time) after it.
const TIMEOUT_MS: i64 = 50;

/// `(order id, amount, event time)`.
type Order = (u64, i64, i64);
/// `(order id, event time)`: every order but each third is paid, 5 ms after it.
type Payment = (u64, i64);

fn order(i: u64) -> Order {
    (i, (i % 100) as i64, i as i64)
}

fn paid(i: u64) -> bool {
    !i.is_multiple_of(3)
}

/// Joins each order with its payment; reports orders unpaid after the timeout.
#[derive(Default)]
struct PaymentCheck {
    order: Option<ValueState<i64>>,
    payment: Option<ValueState<bool>>,
}

type Outcome = (u64, Option<i64>);

impl KeyedCoProcessFunction<u64, Order, Payment, Outcome> for PaymentCheck {
    fn open(&mut self, states: &mut KeyedStateRegistry<'_, u64>) -> Result<(), TaskError> {
        self.order = Some(states.value_state(&weir_runtime::ValueStateDescriptor::new("order"))?);
        self.payment =
            Some(states.value_state(&weir_runtime::ValueStateDescriptor::new("payment"))?);
        Ok(())
    }

    fn process_element1(
        &mut self,
        o: Order,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Outcome>,
    ) -> Result<(), TaskError> {
        let payment = self.payment.unwrap();
        if ctx.value(payment).is_some() {
            ctx.clear(payment);
            return out.collect((o.0, Some(o.1)));
        }
        ctx.update(self.order.unwrap(), o.1);
        ctx.register_event_time_timer(o.2 + TIMEOUT_MS);
        Ok(())
    }

    fn process_element2(
        &mut self,
        p: Payment,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Outcome>,
    ) -> Result<(), TaskError> {
        let order = self.order.unwrap();
        if let Some(&amount) = ctx.value(order) {
            ctx.clear(order);
            ctx.delete_event_time_timer(p.1 - 5 + TIMEOUT_MS);
            return out.collect((p.0, Some(amount)));
        }
        ctx.update(self.payment.unwrap(), true);
        Ok(())
    }

    fn on_timer(
        &mut self,
        _timestamp: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, Outcome>,
    ) -> Result<(), TaskError> {
        let order = self.order.unwrap();
        if ctx.value(order).is_some() {
            ctx.clear(order);
            return out.collect((*ctx.current_key(), None));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_streams_share_keyed_state_and_timers_exactly_once_under_failures() {
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(10))
        .set_restart_strategy(RestartStrategy::FixedDelay {
            attempts: 3,
            delay: Duration::ZERO,
        });
    env.set_checkpoint_dir(tempfile::tempdir().unwrap().keep());
    env.config_mut().batch_size = 32;
    let failures = Failures::paced(vec![ORDERS / 2], 500);
    let orders = env
        .from_collection((0..ORDERS).map(order).collect())
        .uid("orders")
        .assign_timestamps_and_watermarks(Duration::from_millis(10), |o: &Order| o.2)
        .uid("order-watermarks");
    let orders = inject(orders, &failures);
    let payments = env
        .from_collection(
            (0..ORDERS)
                .filter(|&i| paid(i))
                .map(|i| (i, i as i64 + 5))
                .collect(),
        )
        .uid("payments")
        .assign_timestamps_and_watermarks(Duration::from_millis(10), |p: &Payment| p.1)
        .uid("payment-watermarks");
    let outcomes = orders
        .connect(payments)
        .key_by(|o: &Order| &o.0, |p: &Payment| &p.0)
        .process("Payment Check", PaymentCheck::default)
        .uid("payment-check")
        .collect();
    let r = env.execute().bounded().await.unwrap();
    assert_eq!(r.restarts, 1);
    let mut got = outcomes.records();
    got.sort();
    let want: Vec<Outcome> = (0..ORDERS)
        .map(|i| (i, paid(i).then_some(order(i).1)))
        .collect();
    assert_eq!(got, want);
}
