//! What the cloud asks of an edge node through a stream inside its link
//! (the `stream` crate's tunnel): the kubelet's streaming and stats API, typed. The
//! cloud encodes a [`StreamRequest`] as the stream's opening; the node
//! serves it (edged) or refuses it.
//!
//! Channels follow Kubernetes' remote command protocol: 0 stdin, 1 stdout,
//! 2 stderr, 3 the error channel (a `metav1.Status` as JSON, the exit
//! code), 4 terminal resizes (`{"Width":w,"Height":h}`). A log stream
//! carries its bytes on stdout; a forwarded port its bytes on channel 0
//! (both ways) and an error on channel 3.

use serde::{Deserialize, Serialize};

/// The stream channels.
pub mod channel {
    /// Standard input (a forwarded port's data, both ways).
    pub const STDIN: u8 = 0;
    /// Standard output (a log's bytes).
    pub const STDOUT: u8 = 1;
    /// Standard error.
    pub const STDERR: u8 = 2;
    /// The outcome: a `metav1.Status` as JSON (an exec's exit code).
    pub const ERROR: u8 = 3;
    /// Terminal size changes, `{"Width":w,"Height":h}`.
    pub const RESIZE: u8 = 4;
}

/// A pod on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// How a container's log is read: the kubelet's `/containerLogs` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogOptions {
    /// Keep sending what the container writes.
    #[serde(default)]
    pub follow: bool,
    /// Only the last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_lines: Option<i64>,
    /// Only lines written in the last seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seconds: Option<i64>,
    /// Only lines written since (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_time: Option<String>,
    /// Each line with its timestamp.
    #[serde(default)]
    pub timestamps: bool,
    /// The container's previous run.
    #[serde(default)]
    pub previous: bool,
    /// At most this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<i64>,
}

/// Why a query could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("query parameter {name}: {reason}")]
pub struct QueryError {
    /// The parameter.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

fn flag(name: &str, value: &str) -> Result<bool, QueryError> {
    match value {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(QueryError {
            name: name.to_owned(),
            reason: format!("{other:?} is not true or false"),
        }),
    }
}

fn number(name: &str, value: &str) -> Result<i64, QueryError> {
    value.parse().map_err(|_| QueryError {
        name: name.to_owned(),
        reason: format!("{value:?} is not a number"),
    })
}

impl LogOptions {
    /// The options of a kubelet `/containerLogs` query, given as decoded
    /// name and value pairs; unknown names are ignored, as the kubelet
    /// does.
    pub fn from_query<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<LogOptions, QueryError> {
        let mut options = LogOptions::default();
        for (name, value) in pairs {
            match name {
                "follow" => options.follow = flag(name, value)?,
                "tailLines" => options.tail_lines = Some(number(name, value)?),
                "sinceSeconds" => options.since_seconds = Some(number(name, value)?),
                "sinceTime" => options.since_time = Some(value.to_owned()),
                "timestamps" => options.timestamps = flag(name, value)?,
                "previous" => options.previous = flag(name, value)?,
                "limitBytes" => options.limit_bytes = Some(number(name, value)?),
                _ => {}
            }
        }
        Ok(options)
    }
}

/// Which standard streams a command or an attach uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Io {
    /// Input is sent (channel 0).
    #[serde(default)]
    pub stdin: bool,
    /// Output is wanted (channel 1).
    #[serde(default)]
    pub stdout: bool,
    /// Errors are wanted (channel 2; merged into stdout with a tty).
    #[serde(default)]
    pub stderr: bool,
    /// A terminal (resizes on channel 4).
    #[serde(default)]
    pub tty: bool,
}

/// Which resource figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StatsKind {
    /// The kubelet's `/stats/summary` (JSON).
    Summary,
    /// The kubelet's `/metrics/resource` (Prometheus text).
    ResourceMetrics,
}

/// What one stream asks of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StreamRequest {
    /// A container's log, on stdout.
    Logs {
        /// The pod.
        pod: PodRef,
        /// The container.
        container: String,
        /// How.
        options: LogOptions,
    },
    /// A command run in a container.
    Exec {
        /// The pod.
        pod: PodRef,
        /// The container.
        container: String,
        /// The command and its arguments.
        command: Vec<String>,
        /// Its standard streams.
        io: Io,
    },
    /// The standard streams of a container's main process.
    Attach {
        /// The pod.
        pod: PodRef,
        /// The container.
        container: String,
        /// Which ones.
        io: Io,
    },
    /// One connection to a port of the pod's network namespace.
    PortForward {
        /// The pod.
        pod: PodRef,
        /// The port.
        port: u16,
    },
    /// The node's and its pods' resource figures, then the end.
    Stats {
        /// Which.
        what: StatsKind,
    },
    /// A kubelet streaming request as its caller made it (kube-apiserver,
    /// speaking SPDY or WebSocket): the node hands the HTTP upgrade, with
    /// the caller's protocol headers, to the runtime's streaming server
    /// and carries bytes both ways, unread: the caller's on stdin, the
    /// runtime's (its response head first) on stdout.
    Upgrade {
        /// The pod.
        pod: PodRef,
        /// What is asked of it.
        target: UpgradeTarget,
        /// The request's method (`GET` or `POST`).
        method: String,
        /// The protocol headers of the upgrade (`Upgrade`, `Connection`,
        /// `X-Stream-Protocol-Version`, `Sec-WebSocket-*`).
        headers: Vec<(String, String)>,
    },
}

/// What an [`StreamRequest::Upgrade`] asks of the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "camelCase")]
pub enum UpgradeTarget {
    /// A command run in a container.
    Exec {
        /// The container.
        container: String,
        /// The command and its arguments.
        command: Vec<String>,
        /// Its standard streams.
        io: Io,
    },
    /// The standard streams of a container's main process.
    Attach {
        /// The container.
        container: String,
        /// Which ones.
        io: Io,
    },
    /// The pod's ports: named in the request (WebSocket: the kubelet's
    /// `port` query), or by each stream inside the protocol (SPDY).
    PortForward {
        /// The ports a WebSocket forwards.
        #[serde(default)]
        ports: Vec<u16>,
    },
}

/// The headers of an upgrade that are passed on to the runtime: the
/// protocol's own, never the caller's credentials.
pub fn is_upgrade_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "upgrade" | "connection" | "x-stream-protocol-version"
    ) || name.starts_with("sec-websocket-")
}

impl Io {
    /// The standard streams of a kubelet `/exec` or `/attach` query
    /// (`input`, `output`, `error`, `tty`), or of the API's (`stdin`,
    /// `stdout`, `stderr`, `tty`).
    pub fn from_query<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Io, QueryError> {
        let mut io = Io::default();
        for (name, value) in pairs {
            match name {
                "input" | "stdin" => io.stdin = flag(name, value)?,
                "output" | "stdout" => io.stdout = flag(name, value)?,
                "error" | "stderr" => io.stderr = flag(name, value)?,
                "tty" => io.tty = flag(name, value)?,
                _ => {}
            }
        }
        Ok(io)
    }
}

impl StreamRequest {
    /// The request as a stream's opening.
    pub fn encode(&self) -> Vec<u8> {
        // A plain tree of strings, numbers and flags: it always encodes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A stream's opening as a request.
    pub fn decode(bytes: &[u8]) -> Result<StreamRequest, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The pod it is about, if any.
    pub fn pod(&self) -> Option<&PodRef> {
        match self {
            StreamRequest::Logs { pod, .. }
            | StreamRequest::Exec { pod, .. }
            | StreamRequest::Attach { pod, .. }
            | StreamRequest::PortForward { pod, .. }
            | StreamRequest::Upgrade { pod, .. } => Some(pod),
            StreamRequest::Stats { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_back_as_written() {
        let pod = PodRef {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
        };
        let requests = [
            StreamRequest::Logs {
                pod: pod.clone(),
                container: "c".to_owned(),
                options: LogOptions {
                    follow: true,
                    tail_lines: Some(10),
                    ..LogOptions::default()
                },
            },
            StreamRequest::Exec {
                pod: pod.clone(),
                container: "c".to_owned(),
                command: vec!["sh".to_owned(), "-c".to_owned(), "echo hi".to_owned()],
                io: Io {
                    stdin: true,
                    stdout: true,
                    stderr: false,
                    tty: true,
                },
            },
            StreamRequest::PortForward {
                pod: pod.clone(),
                port: 80,
            },
            StreamRequest::Upgrade {
                pod,
                target: UpgradeTarget::Exec {
                    container: "c".to_owned(),
                    command: vec!["date".to_owned()],
                    io: Io {
                        stdout: true,
                        ..Io::default()
                    },
                },
                method: "POST".to_owned(),
                headers: vec![("Upgrade".to_owned(), "SPDY/3.1".to_owned())],
            },
            StreamRequest::Stats {
                what: StatsKind::Summary,
            },
        ];
        for request in requests {
            assert_eq!(StreamRequest::decode(&request.encode()).ok(), Some(request));
        }
        assert!(StreamRequest::decode(b"{\"kind\":\"reboot\"}").is_err());
    }

    #[test]
    fn log_options_come_from_the_kubelets_query() {
        let options = LogOptions::from_query([
            ("follow", "true"),
            ("tailLines", "20"),
            ("timestamps", ""),
            ("limitBytes", "4096"),
            ("pretty", "x"),
        ])
        .expect("valid");
        assert_eq!(
            options,
            LogOptions {
                follow: true,
                tail_lines: Some(20),
                timestamps: true,
                limit_bytes: Some(4096),
                ..LogOptions::default()
            }
        );
        assert_eq!(
            LogOptions::from_query([("tailLines", "ten")]),
            Err(QueryError {
                name: "tailLines".to_owned(),
                reason: "\"ten\" is not a number".to_owned()
            })
        );
        assert!(LogOptions::from_query([("follow", "maybe")]).is_err());
    }

    #[test]
    fn io_comes_from_the_kubelets_query_and_the_apis() {
        let kubelet = Io::from_query([("input", "1"), ("output", "1"), ("tty", "1")]);
        let api = Io::from_query([("stdin", "true"), ("stdout", "true"), ("tty", "true")]);
        let expected = Io {
            stdin: true,
            stdout: true,
            stderr: false,
            tty: true,
        };
        assert_eq!(kubelet, Ok(expected));
        assert_eq!(api, Ok(expected));
        assert!(Io::from_query([("tty", "yes")]).is_err());
    }

    #[test]
    fn only_protocol_headers_are_passed_on() {
        for passed in [
            "Upgrade",
            "connection",
            "X-Stream-Protocol-Version",
            "Sec-WebSocket-Protocol",
        ] {
            assert!(is_upgrade_header(passed), "{passed}");
        }
        for kept in ["Authorization", "Cookie", "X-Remote-User", "Host"] {
            assert!(!is_upgrade_header(kept), "{kept}");
        }
    }
}
