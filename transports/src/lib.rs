//! Transports for edgehive: one trait for listening, dialing and a framed,
//! bidirectional connection that carries beehive messages, implemented over
//! WebSocket, QUIC and Unix domain sockets.
//!
//! Status: the trait and its three implementations arrive with the transports
//! issue; until then this crate only reserves its name and features.
