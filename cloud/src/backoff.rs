//! Growing pauses between attempts of something that keeps failing (a
//! watch, a lease): doubled after each, capped, back to the first once it
//! works again.

use std::time::Duration;

/// The pause before the next attempt.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            max,
        }
    }

    /// Waits the current pause, and doubles the next.
    pub(crate) async fn pause(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(self.max);
    }

    /// It worked: the next pause is the first again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}
