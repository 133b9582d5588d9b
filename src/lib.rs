//! edgehive: KubeEdge rebuilt in Rust as an actix actor system.
//!
//! One dependency line for an embedder; features pick the parts:
//!
//! | feature | brings |
//! | --- | --- |
//! | (always) | [`beehive`]: the module runtime and message model |
//! | `edge` | edgehub, metamanager, edged, devicetwin, eventbus |
//! | `cloud` | cloudhub, and the [`cloud`] control plane: edgecontroller, devicecontroller, desired-state backends, admin API |
//! | `ws`, `quic`, `uds` | the transports |
//!
//! The binaries (`cloudcore`, `edgecore`, `edgehivectl`) are crates of
//! their own under `cmd/`.
//!
//! ```toml
//! [dependencies]
//! edgehive = { version = "0.1", default-features = false, features = ["edge", "quic"] }
//! ```

#[cfg(any(feature = "edge", feature = "cloud"))]
pub use apis;
pub use beehive;
#[cfg(feature = "cloud")]
pub use cloud;
#[cfg(feature = "edge")]
pub use edged;
#[cfg(any(feature = "edge", feature = "cloud"))]
pub use hub;
#[cfg(feature = "edge")]
pub use meta;
#[cfg(any(feature = "edge", feature = "cloud"))]
pub use stream;
#[cfg(any(feature = "ws", feature = "quic", feature = "uds"))]
pub use transports;
#[cfg(feature = "edge")]
pub use twin;

/// The README's code blocks, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// docs/beehive.md's code blocks, compiled and run as doc tests.
#[doc = include_str!("../docs/beehive.md")]
#[cfg(doctest)]
pub struct BeehiveDoctests;

/// docs/transports.md's code blocks, compiled as doc tests.
#[doc = include_str!("../docs/transports.md")]
#[cfg(doctest)]
pub struct TransportsDoctests;
