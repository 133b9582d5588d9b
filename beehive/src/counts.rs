//! Messages each module handled, by operation, for metrics: one atomic
//! counter per known operation in each module, so counting costs one
//! relaxed add and no lock.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::constants::operation;

/// The operations counted by name; any other counts as `other`.
pub const COUNTED: [&str; 13] = [
    operation::INSERT,
    operation::UPDATE,
    operation::PATCH,
    operation::DELETE,
    operation::QUERY,
    operation::UPLOAD,
    operation::RESPONSE,
    operation::ERROR,
    operation::KEEPALIVE,
    operation::PUBLISH,
    operation::SUBSCRIBE,
    operation::NODE_CONNECTED,
    operation::NODE_DISCONNECTED,
];

/// The counters of one module.
#[derive(Debug, Default)]
pub struct HandledCounts {
    counts: [AtomicU64; COUNTED.len() + 1],
}

impl HandledCounts {
    /// Counts one message of `operation`.
    ///
    /// Only the module's delivery loop counts, and one incarnation of a
    /// module runs at a time (the next starts after the last is gone, and
    /// the registry's lock orders the two), so a plain load and store is
    /// an exact count: a locked add per message bought nothing but its
    /// cost. Readers see each counter whole, as before.
    pub(crate) fn count(&self, operation: &str) {
        let slot = COUNTED
            .iter()
            .position(|op| *op == operation)
            .unwrap_or(COUNTED.len());
        let counter = &self.counts[slot];
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// Every operation seen at least once, with its count.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        COUNTED
            .iter()
            .copied()
            .chain(std::iter::once("other"))
            .zip(self.counts.iter())
            .map(|(op, count)| (op, count.load(Ordering::Relaxed)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_counted_by_name_and_the_rest_as_other() {
        let counts = HandledCounts::default();
        counts.count(operation::INSERT);
        counts.count(operation::INSERT);
        counts.count(operation::QUERY);
        counts.count("something-else");
        assert_eq!(
            counts.snapshot(),
            vec![("insert", 2), ("query", 1), ("other", 1)]
        );
    }
}
