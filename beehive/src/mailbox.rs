//! A module's mailbox: a bounded queue that many senders fill and one
//! module drains, taking everything waiting at once.
//!
//! A send is one short lock around a push. The module takes the whole queue
//! under one lock and then handles what it took without touching the lock
//! again, so on the module's side a message costs nothing shared. A tokio
//! bounded channel costs several atomic operations per message on each side,
//! and its receiver takes a mutex per message to give back a permit; with
//! this mailbox the hive's async sends went from 3.9 M to 5.3 M msgs/s on
//! the 2-core development machine (docs/benchmarks.md, session 24).
//! The lock is `parking_lot`'s: it spins briefly before it sleeps, so a
//! sender and a module on two threads meet in batches rather than waking
//! each other for every message.
//!
//! **Capacity.** `capacity` messages may wait for the module to take them;
//! a sender finding that many waits (or gets [`Refused::Full`]). What the
//! module took and has not handled yet is held apart, so during a burst up
//! to twice `capacity` messages exist. [`Mailbox::queued`] counts both.
//!
//! **Order and fairness.** Messages come out in the order they were
//! queued. Senders waiting for room are all woken by the next take and
//! race for it: unlike tokio's semaphore, a waiting sender holds no place
//! in line, and a `try_send` may overtake it.
//!
//! **Closing.** After [`Inbox::close`] (or once the inbox is dropped) every
//! send is refused, and what is queued still drains: a send is checked
//! against the close under the same lock it pushes under, so nothing slips
//! in behind the last message drained. When every [`Mailbox`] is dropped the
//! inbox drains and then ends too.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// Buffers larger than this are given back when the module runs dry after
/// a batch smaller than this (a burst is over), so a mailbox that once
/// filled does not keep the burst's memory; a module that runs dry after
/// every large batch (a steady stream) keeps its buffers instead of growing
/// them again each time.
const SPARE: usize = 64;

/// Creates a mailbox holding up to `capacity` waiting messages (at least 1).
pub(crate) fn mailbox<T>(capacity: usize) -> (Mailbox<T>, Inbox<T>) {
    let shared = Arc::new(Shared {
        waiting: Mutex::new(Waiting {
            queue: VecDeque::new(),
            closed: false,
            senders_gone: false,
            module: None,
            senders_wait: false,
        }),
        capacity: capacity.max(1),
        room: Notify::new(),
        senders: AtomicUsize::new(1),
        in_hand: InHand(AtomicUsize::new(0)),
    });
    (
        Mailbox {
            shared: shared.clone(),
        },
        Inbox {
            shared,
            taken: VecDeque::new(),
            last_batch: 0,
        },
    )
}

/// Why [`Mailbox::try_send`] did not take a message; the message comes back.
#[derive(Debug)]
pub(crate) enum Refused<T> {
    /// `capacity` messages wait already.
    Full(T),
    /// The inbox was closed or dropped.
    Closed(T),
}

struct Shared<T> {
    waiting: Mutex<Waiting<T>>,
    capacity: usize,
    /// Wakes senders waiting for room (or for the close).
    room: Notify,
    /// Live [`Mailbox`] handles.
    senders: AtomicUsize,
    in_hand: InHand,
}

/// What the module took and has not handled yet, written by the module
/// alone, on a cache line of its own so that writing it does not slow
/// senders taking the lock beside it.
#[repr(align(128))]
struct InHand(AtomicUsize);

/// What the lock guards.
struct Waiting<T> {
    queue: VecDeque<T>,
    closed: bool,
    senders_gone: bool,
    /// The module's task, parked on an empty queue.
    module: Option<Waker>,
    /// A sender waits for room: the next take wakes it.
    senders_wait: bool,
}

/// The sending side; cheap to clone.
pub(crate) struct Mailbox<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Mailbox {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            let module = {
                let mut waiting = self.shared.waiting.lock();
                waiting.senders_gone = true;
                waiting.module.take()
            };
            if let Some(module) = module {
                module.wake();
            }
        }
    }
}

impl<T> Mailbox<T> {
    /// Queues `msg` if there is room, without waiting (the hive offers
    /// through [`Mailbox::reserve`] instead).
    #[cfg(test)]
    pub(crate) fn try_send(&self, msg: T) -> Result<(), Refused<T>> {
        self.push(msg, false)
    }

    /// Queues `msg`, waiting for room; a closed inbox hands it back.
    pub(crate) async fn send(&self, mut msg: T) -> Result<(), T> {
        loop {
            // Made before the queue is looked at: a `Notified` hears every
            // `notify_waiters` from its creation on, polled or not, so a
            // take between the look and the wait still wakes this sender
            // (and one that finds room costs no lock of the `Notify`).
            let room = self.shared.room.notified();
            match self.push(msg, true) {
                Ok(()) => return Ok(()),
                Err(Refused::Closed(back)) => return Err(back),
                Err(Refused::Full(back)) => msg = back,
            }
            room.await;
        }
    }

    /// Queues `msg` if there is room; `wait_for_room` asks the next take
    /// to wake senders when there is none.
    #[inline]
    fn push(&self, msg: T, wait_for_room: bool) -> Result<(), Refused<T>> {
        match self.reserve(wait_for_room) {
            Ok(room) => {
                room.push(msg);
                Ok(())
            }
            Err(NoRoom::Full) => Err(Refused::Full(msg)),
            Err(NoRoom::Closed) => Err(Refused::Closed(msg)),
        }
    }

    /// Room for one message, the lock held until [`Room::push`] (or the
    /// room is dropped unused): the caller decides what to do about a full
    /// or closed mailbox before it parts with its message, so a message
    /// that is taken moves once, straight into the queue, and is never
    /// carried in a result that might have handed it back.
    #[inline]
    pub(crate) fn reserve(&self, wait_for_room: bool) -> Result<Room<'_, T>, NoRoom> {
        let mut waiting = self.shared.waiting.lock();
        if waiting.closed {
            return Err(NoRoom::Closed);
        }
        if waiting.queue.len() >= self.shared.capacity {
            waiting.senders_wait |= wait_for_room;
            return Err(NoRoom::Full);
        }
        Ok(Room { waiting })
    }

    /// Messages waiting and taken but not yet handled.
    pub(crate) fn queued(&self) -> usize {
        // Both read under the lock a take stores `in_hand` under, so a
        // batch is counted once: waiting, or in hand.
        let waiting = self.shared.waiting.lock();
        waiting.queue.len() + self.shared.in_hand.0.load(Ordering::Relaxed)
    }

    /// How many messages may wait before senders do.
    pub(crate) fn capacity(&self) -> usize {
        self.shared.capacity
    }
}

/// Why [`Mailbox::reserve`] found no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// `capacity` messages wait already.
    Full,
    /// The inbox was closed or dropped.
    Closed,
}

/// Room for one message in a mailbox that was open and not full when the
/// lock was taken; the lock is held, so both still hold at the push.
pub(crate) struct Room<'a, T> {
    waiting: MutexGuard<'a, Waiting<T>>,
}

impl<T> Room<'_, T> {
    /// Queues `msg` and wakes the module if it waits for one.
    #[inline]
    pub(crate) fn push(mut self, msg: T) {
        self.waiting.queue.push_back(msg);
        let module = self.waiting.module.take();
        drop(self.waiting);
        if let Some(module) = module {
            module.wake();
        }
    }
}

/// The module's side: one per mailbox, handed from one incarnation of a
/// module to the next together with what it took and did not handle.
pub(crate) struct Inbox<T> {
    shared: Arc<Shared<T>>,
    /// Taken from the queue, not yet handed out, oldest first.
    taken: VecDeque<T>,
    /// Size of the last batch taken.
    last_batch: usize,
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<T> Inbox<T> {
    /// The next message, in the order sent; `None` once the mailbox is
    /// closed (or every sender is gone) and empty.
    #[inline]
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        match self.poll_ready(cx) {
            Poll::Ready(true) => Poll::Ready(self.next_ready()),
            Poll::Ready(false) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Whether a message is ready for [`Inbox::next_ready`]: `Ready(true)`
    /// when one is, `Ready(false)` once the mailbox is closed (or every
    /// sender is gone) and empty. Takes the waiting batch if nothing taken
    /// is left.
    ///
    /// Split from taking the message so that the message leaves the queue
    /// by one path only: merging this function's two ways of finding one
    /// (left from the last batch, or a new batch) into one returned value
    /// cost two more copies of a 216-byte `Message` per delivery.
    #[inline]
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if !self.taken.is_empty() {
            return Poll::Ready(true);
        }
        self.poll_batch(cx)
    }

    /// The message [`Inbox::next_ready`] would return, left in place.
    #[inline]
    pub(crate) fn peek_ready(&self) -> Option<&T> {
        self.taken.front()
    }

    /// The next message ready, oldest first; after `poll_ready` said
    /// `Ready(true)` it is `Some`.
    #[inline]
    pub(crate) fn next_ready(&mut self) -> Option<T> {
        let msg = self.taken.pop_front();
        self.shared
            .in_hand
            .0
            .store(self.taken.len(), Ordering::Relaxed);
        msg
    }

    /// Takes the waiting batch, or parks the module on an empty queue.
    fn poll_batch(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut waiting = self.shared.waiting.lock();
        if waiting.queue.is_empty() {
            if waiting.closed || waiting.senders_gone {
                return Poll::Ready(false);
            }
            // Dry after a small batch: a burst (if any) is over, and the
            // buffers it grew are given back, this side's and the queue's.
            let burst_over = self.last_batch < SPARE;
            let spare = (burst_over && waiting.queue.capacity() > SPARE)
                .then(|| std::mem::take(&mut waiting.queue));
            let replaced = match &waiting.module {
                Some(parked) if parked.will_wake(cx.waker()) => None,
                _ => waiting.module.replace(cx.waker().clone()),
            };
            drop(waiting);
            // Freed outside the lock.
            drop((spare, replaced));
            if burst_over && self.taken.capacity() > SPARE {
                self.taken = VecDeque::new();
            }
            return Poll::Pending;
        }
        std::mem::swap(&mut waiting.queue, &mut self.taken);
        let senders_wait = std::mem::take(&mut waiting.senders_wait);
        self.last_batch = self.taken.len();
        // Stored under the lock, so `queued` never counts a batch twice
        // or not at all: the whole batch is in hand until `next_ready`
        // hands its messages out.
        self.shared
            .in_hand
            .0
            .store(self.taken.len(), Ordering::Relaxed);
        drop(waiting);
        if senders_wait {
            self.shared.room.notify_waiters();
        }
        Poll::Ready(true)
    }

    /// [`Inbox::poll_recv`] as a future.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Refuses every later send; what is queued still drains.
    pub(crate) fn close(&mut self) {
        self.shared.waiting.lock().closed = true;
        self.shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
