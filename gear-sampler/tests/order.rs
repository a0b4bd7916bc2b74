//! Deterministic strategies against a sorted reference: FIFO, LIFO and the
//! heaps return exactly the reference order (ties: the older insert
//! first), distinct while items last and then from the first again.

mod common;

use common::{key, rng};
use gear_core::{Selector, SlotKey};
use gear_sampler::{Fifo, Lifo, MaxHeap, MinHeap};
use proptest::prelude::*;

const CAPACITY: u32 = 24;

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert { slot: u32, priority: Option<u8> },
    Update { pick: usize, priority: u8 },
    Remove { pick: usize },
    Sample { n: usize },
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct priorities, so ties are common.
    let p = 0u8..4;
    prop_oneof![
        4 => (0..CAPACITY, prop::option::weighted(0.8, p.clone())).prop_map(|(slot, priority)| Op::Insert { slot, priority }),
        2 => (any::<usize>(), p).prop_map(|(pick, priority)| Op::Update { pick, priority }),
        2 => any::<usize>().prop_map(|pick| Op::Remove { pick }),
        2 => (0usize..60).prop_map(|n| Op::Sample { n }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Item {
    key: SlotKey,
    priority: f64,
    seq: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    Fifo,
    Lifo,
    Max,
    Min,
}

fn reference(items: &[Item], order: Order) -> Vec<SlotKey> {
    let mut v = items.to_vec();
    match order {
        Order::Fifo => v.sort_by_key(|i| i.seq),
        Order::Lifo => v.sort_by_key(|i| std::cmp::Reverse(i.seq)),
        Order::Max => v.sort_by(|a, b| b.priority.total_cmp(&a.priority).then(a.seq.cmp(&b.seq))),
        Order::Min => v.sort_by(|a, b| a.priority.total_cmp(&b.priority).then(a.seq.cmp(&b.seq))),
    }
    v.into_iter().map(|i| i.key).collect()
}

fn check_against_reference(mut s: Box<dyn Selector>, order: Order, ops: &[Op]) -> Result<(), TestCaseError> {
    s.prepare(u64::from(CAPACITY)).unwrap();
    let mut items: Vec<Item> = Vec::new();
    let mut generation = [0u32; CAPACITY as usize];
    let mut seq = 0;
    let mut max_seen = 0.0f64;
    let mut out = Vec::new();
    for &op in ops {
        match op {
            Op::Insert { slot, priority } => {
                if items.iter().any(|i| i.key.slot == slot) {
                    continue;
                }
                generation[slot as usize] += 1;
                let k = key(slot, generation[slot as usize]);
                let given = priority.map(f64::from);
                let p = s.insert(k, given).unwrap();
                if let Some(g) = given {
                    prop_assert_eq!(p, g);
                } else if matches!(order, Order::Max | Order::Min) {
                    let expected = if max_seen > 0.0 { max_seen } else { 1.0 };
                    prop_assert_eq!(p, expected, "heap default priority");
                }
                max_seen = max_seen.max(p);
                items.push(Item { key: k, priority: p, seq });
                seq += 1;
            }
            Op::Update { pick, priority } => {
                if items.is_empty() {
                    continue;
                }
                let i = pick % items.len();
                let p = f64::from(priority);
                s.update(items[i].key, p).unwrap();
                items[i].priority = p;
                max_seen = max_seen.max(p);
            }
            Op::Remove { pick } => {
                if items.is_empty() {
                    continue;
                }
                let i = pick % items.len();
                s.remove(items.swap_remove(i).key).unwrap();
            }
            Op::Sample { n } => {
                out.clear();
                let r = s.sample(n, &mut rng(0), &mut out);
                if items.is_empty() {
                    prop_assert!(r.is_err());
                    continue;
                }
                r.unwrap();
                let want = reference(&items, order);
                let expected: Vec<SlotKey> = (0..n).map(|i| want[i % want.len()]).collect();
                let got: Vec<SlotKey> = out.iter().map(|d| d.key).collect();
                prop_assert_eq!(got, expected, "{:?} sample({})", order, n);
                prop_assert!(out.iter().all(|d| d.probability == 1.0 && d.weight == 1.0));
            }
        }
        prop_assert_eq!(s.len(), items.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn fifo_matches_insertion_order(ops in prop::collection::vec(op(), 0..150)) {
        check_against_reference(Box::new(Fifo::new()), Order::Fifo, &ops)?;
    }

    #[test]
    fn lifo_matches_reverse_insertion_order(ops in prop::collection::vec(op(), 0..150)) {
        check_against_reference(Box::new(Lifo::new()), Order::Lifo, &ops)?;
    }

    #[test]
    fn max_heap_matches_priority_descending_then_older(ops in prop::collection::vec(op(), 0..150)) {
        check_against_reference(Box::new(MaxHeap::new()), Order::Max, &ops)?;
    }

    #[test]
    fn min_heap_matches_priority_ascending_then_older(ops in prop::collection::vec(op(), 0..150)) {
        check_against_reference(Box::new(MinHeap::new()), Order::Min, &ops)?;
    }
}

#[test]
fn peeks_name_what_sample_one_returns() {
    let mut fifo = Fifo::new();
    let mut lifo = Lifo::new();
    let mut max = MaxHeap::new();
    let mut min = MinHeap::new();
    assert_eq!((fifo.peek(), lifo.peek(), max.peek(), min.peek()), (None, None, None, None));
    for s in [&mut fifo as &mut dyn Selector, &mut lifo, &mut max, &mut min] {
        s.prepare(8).unwrap();
        for (slot, p) in [(5, 2.0), (1, 9.0), (3, 0.5), (6, 9.0), (2, 0.5)] {
            s.insert(key(slot, 1), Some(p)).unwrap();
        }
    }
    assert_eq!(fifo.peek(), Some(key(5, 1)));
    assert_eq!(lifo.peek(), Some(key(2, 1)));
    assert_eq!(max.peek(), Some((key(1, 1), 9.0)), "tie at 9.0: the older insert");
    assert_eq!(min.peek(), Some((key(3, 1), 0.5)), "tie at 0.5: the older insert");
    max.update(key(6, 1), 10.0).unwrap();
    assert_eq!(max.peek(), Some((key(6, 1), 10.0)));
    assert_eq!(max.priority(key(6, 1)).unwrap(), 10.0);
    min.remove(key(3, 1)).unwrap();
    assert_eq!(min.peek(), Some((key(2, 1), 0.5)));
    // As a remover: evicting repeatedly yields the order, one at a time.
    let mut evicted = Vec::new();
    let mut out = Vec::new();
    while !min.is_empty() {
        out.clear();
        min.sample(1, &mut rng(0), &mut out).unwrap();
        min.remove(out[0].key).unwrap();
        evicted.push(out[0].key.slot);
    }
    assert_eq!(evicted, [2, 5, 1, 6]);
}
