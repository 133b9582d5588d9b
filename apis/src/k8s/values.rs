//! The scalar value types of Kubernetes objects: a resource [`Quantity`]
//! (kept as its text), [`IntOrString`] (a port by number or by name) and
//! [`Time`] (RFC 3339, written to the second).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A resource quantity (`500m`, `128Mi`, `2`), kept as the text it was
/// given: the edge reads the few it needs (see edged's `spec`), the cloud's
/// defaulting writes them in canonical form. A JSON number (`"cpu": 2`,
/// which clients send and Kubernetes accepts) is read as its text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The text of a quantity, or a number written as one.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Text(String),
            Whole(i64),
            Large(u64),
            Fraction(f64),
        }
        Ok(Quantity(match Given::deserialize(deserializer)? {
            Given::Text(text) => text,
            Given::Whole(number) => number.to_string(),
            Given::Large(number) => number.to_string(),
            Given::Fraction(number) => number.to_string(),
        }))
    }
}

/// A number or a name, e.g. a port (`8080` or `http`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    /// A number.
    Int(i32),
    /// A name.
    String(String),
}

impl Default for IntOrString {
    fn default() -> Self {
        IntOrString::Int(0)
    }
}

/// A point in time, as Kubernetes writes it: RFC 3339 in UTC, to the
/// second (`2024-05-01T12:00:00Z`). Read with any offset and fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Time(pub jiff::Timestamp);

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whole seconds in UTC (`%S` leaves the fraction out), as
        // Kubernetes and k8s-openapi write it.
        write!(f, "{}", self.0.strftime("%Y-%m-%dT%H:%M:%SZ"))
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse::<jiff::Timestamp>()
            .map(Time)
            .map_err(serde::de::Error::custom)
    }
}
