//! The mailbox's promises: order, capacity, waking, closing, and a seeded
//! random run of sends, takes and a close checked against a plain queue.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use super::{NoRoom, Refused, mailbox};

/// A waker that counts its wakes.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Wakes {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn poll_once<F: Future>(future: std::pin::Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(waker))
}

#[test]
fn messages_come_out_in_the_order_sent_across_takes() {
    let (tx, mut rx) = mailbox(4);
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);
    for n in 0..4 {
        tx.try_send(n).expect("room");
    }
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(0)));
    // Taken as a batch: the queue has room again while 1..4 are in hand.
    for n in 4..8 {
        tx.try_send(n).expect("room after the take");
    }
    assert_eq!(tx.queued(), 7);
    let seen: Vec<_> = (1..8)
        .map(|_| match rx.poll_recv(&mut cx) {
            Poll::Ready(Some(n)) => n,
            other => panic!("expected a message, got {other:?}"),
        })
        .collect();
    assert_eq!(seen, (1..8).collect::<Vec<_>>());
    assert_eq!(tx.queued(), 0);
    assert_eq!(rx.poll_recv(&mut cx), Poll::Pending);
}

#[test]
fn poll_ready_twice_then_next_ready_gives_the_first_message_and_takes_no_second_batch() {
    let (tx, mut rx) = mailbox(4);
    let mut cx = Context::from_waker(Waker::noop());
    tx.try_send(1).expect("room");
    tx.try_send(2).expect("room");
    assert_eq!(rx.poll_ready(&mut cx), Poll::Ready(true));
    // Sent after the take: waits in the queue, not in the batch taken.
    tx.try_send(3).expect("room after the take");
    assert_eq!(rx.poll_ready(&mut cx), Poll::Ready(true));
    assert_eq!(rx.taken.len(), 2, "the second poll took no second batch");
    assert_eq!(rx.shared.waiting.lock().queue.len(), 1);
    assert_eq!(rx.peek_ready(), Some(&1));
    assert_eq!(tx.queued(), 3, "the ready message counts until popped");
    assert_eq!(rx.next_ready(), Some(1));
    assert_eq!(tx.queued(), 2);
    assert_eq!(rx.next_ready(), Some(2));
    assert_eq!(tx.queued(), 1);
    // Nothing taken is left: next_ready does not reach into the queue.
    assert_eq!(rx.next_ready(), None);
    assert_eq!(tx.queued(), 1);
    assert_eq!(rx.poll_ready(&mut cx), Poll::Ready(true));
    assert_eq!(rx.next_ready(), Some(3));
    assert_eq!(tx.queued(), 0);
    assert_eq!(rx.poll_ready(&mut cx), Poll::Pending);
}

#[test]
fn an_unused_room_changes_nothing_and_releases_the_lock() {
    let (tx, mut rx) = mailbox(2);
    tx.try_send(1).expect("room");
    let room = tx.reserve(true).expect("room for one more");
    assert!(
        tx.shared.waiting.try_lock().is_none(),
        "a room holds the lock"
    );
    drop(room);
    // Checked without blocking, so a leaked lock fails instead of hanging.
    let waiting = tx.shared.waiting.try_lock().expect("the lock is free");
    assert_eq!(waiting.queue.len(), 1);
    assert!(!waiting.closed && !waiting.senders_wait);
    drop(waiting);
    assert_eq!(tx.queued(), 1);
    tx.try_send(2)
        .expect("the room dropped unused took no place");
    assert!(matches!(tx.try_send(3), Err(Refused::Full(3))));
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Pending);
}

#[test]
fn reserve_without_waiting_on_a_full_mailbox_asks_no_wake() {
    let (tx, mut rx) = mailbox(1);
    tx.try_send(1).expect("room");
    assert_eq!(tx.reserve(false).err(), Some(NoRoom::Full));
    assert!(
        !tx.shared.waiting.lock().senders_wait,
        "reserve(false) marks no sender waiting"
    );
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    tx.try_send(2).expect("room after the take");
    // reserve(true) does mark it, and the next take clears the mark.
    assert_eq!(tx.reserve(true).err(), Some(NoRoom::Full));
    assert!(tx.shared.waiting.lock().senders_wait);
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
    assert!(!tx.shared.waiting.lock().senders_wait);
    rx.close();
    assert_eq!(tx.reserve(true).err(), Some(NoRoom::Closed));
    assert!(!tx.shared.waiting.lock().senders_wait);
}

#[test]
fn a_full_queue_refuses_try_send_and_hands_the_message_back() {
    let (tx, _rx) = mailbox(2);
    tx.try_send("a").expect("room");
    tx.try_send("b").expect("room");
    assert!(matches!(tx.try_send("c"), Err(Refused::Full("c"))));
    assert_eq!((tx.queued(), tx.capacity()), (2, 2));
}

#[test]
fn a_waiting_sender_is_woken_by_the_take_and_then_queues() {
    let (tx, mut rx) = mailbox(1);
    tx.try_send(1).expect("room");
    let wakes = Arc::new(Wakes::default());
    let sender_waker = Waker::from(wakes.clone());
    let mut send = Box::pin(tx.send(2));
    assert_eq!(poll_once(send.as_mut(), &sender_waker), Poll::Pending);
    assert_eq!(wakes.count(), 0);
    assert_eq!(
        rx.poll_recv(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(Some(1))
    );
    assert_eq!(wakes.count(), 1, "the take woke the waiting sender");
    assert_eq!(poll_once(send.as_mut(), &sender_waker), Poll::Ready(Ok(())));
    assert_eq!(
        rx.poll_recv(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(Some(2))
    );
}

#[test]
fn a_parked_module_is_woken_by_the_next_send_once() {
    let (tx, mut rx) = mailbox(8);
    let wakes = Arc::new(Wakes::default());
    let module = Waker::from(wakes.clone());
    assert_eq!(
        rx.poll_recv(&mut Context::from_waker(&module)),
        Poll::Pending
    );
    tx.try_send(1).expect("room");
    tx.try_send(2).expect("room");
    assert_eq!(wakes.count(), 1, "one wake per park, not per message");
    let mut cx = Context::from_waker(&module);
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(2)));
}

#[test]
fn close_refuses_new_sends_wakes_waiting_ones_and_still_drains() {
    let (tx, mut rx) = mailbox(1);
    tx.try_send(1).expect("room");
    let wakes = Arc::new(Wakes::default());
    let sender_waker = Waker::from(wakes.clone());
    let mut send = Box::pin(tx.send(2));
    assert_eq!(poll_once(send.as_mut(), &sender_waker), Poll::Pending);
    rx.close();
    assert_eq!(wakes.count(), 1);
    assert_eq!(poll_once(send.as_mut(), &sender_waker), Poll::Ready(Err(2)));
    assert!(matches!(tx.try_send(3), Err(Refused::Closed(3))));
    let mut cx = Context::from_waker(Waker::noop());
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(None));
}

#[test]
fn a_dropped_inbox_refuses_sends_and_gone_senders_end_the_inbox() {
    let (tx, rx) = mailbox::<u32>(4);
    drop(rx);
    assert!(matches!(tx.try_send(1), Err(Refused::Closed(1))));

    let (tx, mut rx) = mailbox(4);
    let other = tx.clone();
    tx.try_send(1).expect("room");
    drop(tx);
    let wakes = Arc::new(Wakes::default());
    let module = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&module);
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Pending, "a clone still sends");
    drop(other);
    assert_eq!(wakes.count(), 1, "the last sender's drop wakes the module");
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(None));
}

#[test]
fn a_burst_s_buffers_are_given_back_once_it_is_over() {
    let (tx, mut rx) = mailbox(4096);
    let mut cx = Context::from_waker(Waker::noop());
    let capacities = |rx: &super::Inbox<u32>| {
        (
            rx.taken.capacity(),
            rx.shared.waiting.lock().queue.capacity(),
        )
    };
    // Two bursts, so that both buffers (the module's and the queue's)
    // grew to a burst's size.
    for _ in 0..2 {
        for n in 0..4096 {
            tx.try_send(n).expect("room");
        }
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(Some(0))));
        for n in 0..4096 {
            tx.try_send(n).expect("room again after the take");
        }
        for _ in 1..8192 {
            assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(Some(_))));
        }
    }
    // Dry right after a large batch (a steady stream looks so): kept.
    assert_eq!(rx.poll_recv(&mut cx), Poll::Pending);
    let (taken, queue) = capacities(&rx);
    assert!(taken >= 4096 && queue >= 4096, "{taken} {queue}");
    // A small batch, then dry: the burst is over, both are given back.
    tx.try_send(1).expect("room");
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(1)));
    assert_eq!(rx.poll_recv(&mut cx), Poll::Pending);
    let (taken, queue) = capacities(&rx);
    assert!(
        taken <= super::SPARE && queue <= super::SPARE,
        "{taken} {queue}"
    );
    // And works on as before.
    tx.try_send(7).expect("room");
    assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Some(7)));
}

/// Seeded random runs: sends from three senders, takes and one close, in
/// any order, checked against a plain queue after every step.
#[test]
fn random_sends_takes_and_a_close_match_a_plain_queue() {
    for seed in 0..300 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let capacity = rng.usize(1..6);
        let (tx, mut rx) = mailbox::<(usize, u32)>(capacity);
        let senders = [tx.clone(), tx.clone(), tx];
        let mut next = [0_u32; 3];
        // The model: what waits in the queue, and what the module took.
        let mut queue: VecDeque<(usize, u32)> = VecDeque::new();
        let mut in_hand: VecDeque<(usize, u32)> = VecDeque::new();
        let mut closed = false;
        let mut cx = Context::from_waker(Waker::noop());
        for step in 0..200 {
            match rng.u8(0..100) {
                0..55 => {
                    let who = rng.usize(0..3);
                    let msg = (who, next[who]);
                    match senders[who].try_send(msg) {
                        Ok(()) => {
                            assert!(!closed && queue.len() < capacity, "seed {seed} step {step}");
                            queue.push_back(msg);
                            next[who] += 1;
                        }
                        Err(Refused::Full(back)) => {
                            assert_eq!(back, msg);
                            assert!(
                                !closed && queue.len() == capacity,
                                "seed {seed} step {step}"
                            );
                        }
                        Err(Refused::Closed(back)) => {
                            assert_eq!(back, msg);
                            assert!(closed, "seed {seed} step {step}");
                        }
                    }
                }
                55..98 => {
                    let expected = match in_hand.pop_front() {
                        Some(msg) => Some(msg),
                        None => {
                            std::mem::swap(&mut queue, &mut in_hand);
                            in_hand.pop_front()
                        }
                    };
                    match (rx.poll_recv(&mut cx), expected) {
                        (Poll::Ready(Some(got)), Some(want)) => {
                            assert_eq!(got, want, "seed {seed} step {step}")
                        }
                        (Poll::Ready(None), None) => assert!(closed),
                        (Poll::Pending, None) => assert!(!closed),
                        (got, want) => panic!("seed {seed} step {step}: {got:?} for {want:?}"),
                    }
                }
                _ => {
                    rx.close();
                    closed = true;
                }
            }
            assert_eq!(
                senders[0].queued(),
                queue.len() + in_hand.len(),
                "seed {seed} step {step}"
            );
        }
    }
}

/// Senders on other threads, each waiting for room as needed: every
/// message arrives once, in each sender's order.
#[test]
fn senders_on_other_threads_lose_nothing_and_keep_their_order() {
    const SENDERS: usize = 4;
    const EACH: u32 = 20_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let (tx, mut rx) = mailbox::<(usize, u32)>(16);
    let received = runtime.block_on(async move {
        for who in 0..SENDERS {
            let tx = tx.clone();
            tokio::spawn(async move {
                for n in 0..EACH {
                    tx.send((who, n)).await.expect("open");
                }
            });
        }
        drop(tx);
        let mut next = [0_u32; SENDERS];
        let mut count = 0;
        // A lost wake-up fails the test instead of hanging it.
        let all = async {
            while let Some((who, n)) = rx.recv().await {
                assert_eq!(n, next[who], "sender {who} out of order");
                next[who] += 1;
                count += 1;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), all)
            .await
            .expect("every message within a minute");
        count
    });
    assert_eq!(received, SENDERS * EACH as usize);
}
