//! Flow control of one tunnel stream, one direction: what the receiving
//! side lets the sending side have in flight. Plain arithmetic, no I/O.
//!
//! The receiver grants `window` bytes at the start. Bytes it receives use
//! the grant up; bytes its consumer takes are granted again, in batches of
//! at least a quarter of the window (so a stream of small reads does not
//! answer each with a frame). A sender that sends beyond its grant broke
//! the protocol: the stream is reset.

/// The receiving side's account of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveWindow {
    window: u32,
    /// Received and not yet taken by the consumer.
    buffered: u32,
    /// Taken by the consumer and not yet granted again.
    taken: u32,
}

/// The sender sent more than it was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{received} bytes received beyond a window of {window}")]
pub struct Overrun {
    /// The bytes received past the window's end.
    pub received: u32,
    /// The window.
    pub window: u32,
}

impl ReceiveWindow {
    /// A stream whose sender may have `window` bytes in flight.
    pub fn new(window: u32) -> ReceiveWindow {
        ReceiveWindow {
            window,
            buffered: 0,
            taken: 0,
        }
    }

    /// `len` bytes arrived.
    pub fn received(&mut self, len: usize) -> Result<(), Overrun> {
        let in_flight = u64::from(self.buffered) + u64::from(self.taken) + len as u64;
        if in_flight > u64::from(self.window) {
            return Err(Overrun {
                received: u32::try_from(in_flight - u64::from(self.window)).unwrap_or(u32::MAX),
                window: self.window,
            });
        }
        // Fits in the window, so in a u32.
        self.buffered += len as u32;
        Ok(())
    }

    /// The consumer took `len` bytes: the credit to grant now, if it is
    /// worth a frame.
    pub fn taken(&mut self, len: usize) -> Option<u32> {
        let len = u32::try_from(len).unwrap_or(u32::MAX).min(self.buffered);
        self.buffered -= len;
        self.taken += len;
        if self.taken >= (self.window / 4).max(1) {
            return Some(std::mem::take(&mut self.taken));
        }
        None
    }

    /// Bytes received and not yet taken.
    pub fn buffered(&self) -> u32 {
        self.buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_comes_back_in_quarters_of_the_window() {
        let mut window = ReceiveWindow::new(1000);
        window.received(600).expect("fits");
        assert_eq!(window.taken(100), None);
        assert_eq!(window.taken(149), None);
        assert_eq!(window.taken(1), Some(250));
        window.received(650).expect("350 + 650 fit");
        assert_eq!(
            window.received(1),
            Err(Overrun {
                received: 1,
                window: 1000
            })
        );
        assert_eq!(window.buffered(), 1000);
        assert_eq!(window.taken(1000), Some(1000));
        assert_eq!(window.buffered(), 0);
    }

    #[test]
    fn taking_more_than_was_received_takes_what_was() {
        let mut window = ReceiveWindow::new(8);
        window.received(2).expect("fits");
        assert_eq!(window.taken(5), Some(2));
        window.received(8).expect("the whole window again");
    }

    /// Whatever the order of sends and takes, a sender that keeps within
    /// what it was granted is never refused, and everything taken is
    /// granted back once the consumer has taken it all.
    #[test]
    fn a_sender_within_its_grants_is_never_refused() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..200 {
            let size = 1 + next(5000) as u32;
            let mut window = ReceiveWindow::new(size);
            let mut credit = u64::from(size);
            let mut granted_back = 0u64;
            let mut sent = 0u64;
            for _ in 0..500 {
                if next(2) == 0 && credit > 0 {
                    let len = 1 + next(credit);
                    window.received(len as usize).expect("within the grant");
                    credit -= len;
                    sent += len;
                } else {
                    let len = next(u64::from(window.buffered()) + 1);
                    if let Some(grant) = window.taken(len as usize) {
                        credit += u64::from(grant);
                        granted_back += u64::from(grant);
                    }
                }
            }
            let rest = window.buffered();
            if let Some(grant) = window.taken(rest as usize) {
                credit += u64::from(grant);
                granted_back += u64::from(grant);
            }
            assert!(credit <= u64::from(size));
            assert!(granted_back <= sent);
            assert!(u64::from(size) - credit < u64::from(size / 4).max(1));
        }
    }
}
