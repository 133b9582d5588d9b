//! What a kubelet API request asks, decided from its method, path and
//! query alone (no I/O): the stream it becomes and the attributes it is
//! authorized by, as the kubelet maps them (`nodes/<subresource>`).

use apis::streams::{Io, LogOptions, PodRef, QueryError, StatsKind, UpgradeTarget};

/// A kubelet API request, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletRequest {
    /// `/healthz`.
    Healthz,
    /// `/containerLogs/{namespace}/{pod}/{container}`.
    Logs {
        /// The pod.
        pod: PodRef,
        /// The container.
        container: String,
        /// How.
        options: LogOptions,
    },
    /// `/exec/...`, `/attach/...`, `/portForward/...`: an upgrade carried
    /// to the runtime as it was made.
    Upgrade {
        /// The pod.
        pod: PodRef,
        /// What of it.
        target: UpgradeTarget,
    },
    /// `/stats/summary`, `/metrics/resource`: the node's figures.
    Stats(StatsKind),
}

/// Why a request is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such path on this kubelet API.
    #[error("{0}: not served by the kubelet API of edge nodes")]
    NotFound(String),
    /// A path or query that does not read.
    #[error("{0}")]
    Bad(String),
    /// The method is not allowed there.
    #[error("method {0} is not allowed here")]
    Method(String),
}

impl From<QueryError> for RouteError {
    fn from(err: QueryError) -> RouteError {
        RouteError::Bad(err.to_string())
    }
}

pub use crate::reviews::Attributes;

/// The attributes `method` on `path` is authorized by. A stream into a
/// pod (exec, attach, port-forward) is `create` however it is asked (a
/// WebSocket's is a GET), so read-only rights on `nodes/proxy` never run a
/// command.
pub fn attributes(method: &str, path: &str) -> Attributes {
    let first = path.split('/').nth(1).unwrap_or("");
    let verb = match method {
        _ if matches!(first, "exec" | "attach" | "portForward") => "create",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    };
    let subresource = match first {
        "stats" => "stats",
        "metrics" => "metrics",
        "logs" => "log",
        "healthz" => "healthz",
        _ => "proxy",
    };
    Attributes { verb, subresource }
}

/// Reads `method` `path`?`query` (the query's pairs decoded).
pub fn route(
    method: &str,
    path: &str,
    query: &[(String, String)],
) -> Result<KubeletRequest, RouteError> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let pairs = || query.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let read_only = |request: KubeletRequest| match method {
        "GET" | "HEAD" => Ok(request),
        other => Err(RouteError::Method(other.to_owned())),
    };
    let streaming = |request: KubeletRequest| match method {
        "GET" | "POST" => Ok(request),
        other => Err(RouteError::Method(other.to_owned())),
    };
    match parts.as_slice() {
        ["healthz"] => read_only(KubeletRequest::Healthz),
        ["stats", "summary"] => read_only(KubeletRequest::Stats(StatsKind::Summary)),
        ["metrics", "resource"] => read_only(KubeletRequest::Stats(StatsKind::ResourceMetrics)),
        ["containerLogs", namespace, pod, container] => read_only(KubeletRequest::Logs {
            pod: pod_ref(namespace, pod)?,
            container: name(container)?,
            options: LogOptions::from_query(pairs())?,
        }),
        ["exec" | "attach", namespace, pod, .., container] if (4..=5).contains(&parts.len()) => {
            let io = Io::from_query(pairs())?;
            let container = name(container)?;
            let target = match parts[0] {
                "exec" => {
                    let command: Vec<String> = query
                        .iter()
                        .filter(|(k, _)| k == "command")
                        .map(|(_, v)| v.clone())
                        .collect();
                    if command.is_empty() {
                        return Err(RouteError::Bad("no command given".to_owned()));
                    }
                    UpgradeTarget::Exec {
                        container,
                        command,
                        io,
                    }
                }
                _ => UpgradeTarget::Attach { container, io },
            };
            streaming(KubeletRequest::Upgrade {
                pod: pod_ref(namespace, pod)?,
                target,
            })
        }
        ["portForward", namespace, pod, ..] if (3..=4).contains(&parts.len()) => {
            let mut ports = Vec::new();
            for (_, value) in query.iter().filter(|(k, _)| k == "port") {
                for port in value.split(',') {
                    match port.parse::<u16>() {
                        Ok(port) if port > 0 => ports.push(port),
                        _ => return Err(RouteError::Bad(format!("{port:?} is not a port"))),
                    }
                }
            }
            streaming(KubeletRequest::Upgrade {
                pod: pod_ref(namespace, pod)?,
                target: UpgradeTarget::PortForward { ports },
            })
        }
        _ => Err(RouteError::NotFound(path.to_owned())),
    }
}

/// A name from a path segment: not empty, no traversal.
fn name(segment: &str) -> Result<String, RouteError> {
    let ok = !segment.is_empty()
        && segment.len() <= 253
        && segment != ".."
        && segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    match ok {
        true => Ok(segment.to_owned()),
        false => Err(RouteError::Bad(format!("{segment:?} is not a valid name"))),
    }
}

fn pod_ref(namespace: &str, pod: &str) -> Result<PodRef, RouteError> {
    Ok(PodRef {
        namespace: name(namespace)?,
        name: name(pod)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn pod() -> PodRef {
        PodRef {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
        }
    }

    #[test]
    fn the_apiservers_calls_read_as_the_kubelet_reads_them() {
        let logs = route(
            "GET",
            "/containerLogs/default/web/httpd",
            &query(&[("follow", "true"), ("tailLines", "5")]),
        );
        assert_eq!(
            logs,
            Ok(KubeletRequest::Logs {
                pod: pod(),
                container: "httpd".to_owned(),
                options: LogOptions {
                    follow: true,
                    tail_lines: Some(5),
                    ..LogOptions::default()
                },
            })
        );
        let exec = route(
            "POST",
            "/exec/default/web/httpd",
            &query(&[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "id"),
                ("output", "1"),
                ("input", "1"),
            ]),
        );
        assert_eq!(
            exec,
            Ok(KubeletRequest::Upgrade {
                pod: pod(),
                target: UpgradeTarget::Exec {
                    container: "httpd".to_owned(),
                    command: vec!["sh".to_owned(), "-c".to_owned(), "id".to_owned()],
                    io: Io {
                        stdin: true,
                        stdout: true,
                        ..Io::default()
                    },
                },
            })
        );
        // The pod's uid may stand before the container.
        let attach = route(
            "GET",
            "/attach/default/web/0e1f/httpd",
            &query(&[("tty", "1")]),
        );
        assert!(matches!(
            attach,
            Ok(KubeletRequest::Upgrade { target: UpgradeTarget::Attach { ref container, io }, .. })
                if container == "httpd" && io.tty
        ));
        for path in ["/portForward/default/web", "/portForward/default/web/0e1f"] {
            assert_eq!(
                route("POST", path, &[]),
                Ok(KubeletRequest::Upgrade {
                    pod: pod(),
                    target: UpgradeTarget::PortForward { ports: Vec::new() }
                })
            );
        }
        // A WebSocket's ports are in the query.
        assert_eq!(
            route(
                "GET",
                "/portForward/default/web",
                &query(&[("port", "80,8080"), ("port", "9090")])
            ),
            Ok(KubeletRequest::Upgrade {
                pod: pod(),
                target: UpgradeTarget::PortForward {
                    ports: vec![80, 8080, 9090]
                }
            })
        );
        assert_eq!(
            route("GET", "/stats/summary", &[]),
            Ok(KubeletRequest::Stats(StatsKind::Summary))
        );
        assert_eq!(
            route("GET", "/metrics/resource", &[]),
            Ok(KubeletRequest::Stats(StatsKind::ResourceMetrics))
        );
    }

    #[test]
    fn what_does_not_read_is_refused() {
        assert!(matches!(
            route("GET", "/exec/default/web/httpd", &[]),
            Err(RouteError::Bad(_))
        ));
        assert!(matches!(
            route("GET", "/containerLogs/default/../x", &[]),
            Err(RouteError::Bad(_))
        ));
        assert!(matches!(
            route("DELETE", "/containerLogs/default/web/c", &[]),
            Err(RouteError::Method(_))
        ));
        assert!(matches!(
            route("GET", "/configz", &[]),
            Err(RouteError::NotFound(_))
        ));
        assert!(matches!(
            route("GET", "/run/default/web/c", &[]),
            Err(RouteError::NotFound(_))
        ));
        assert!(matches!(
            route(
                "GET",
                "/containerLogs/default/web/c",
                &query(&[("tailLines", "x")])
            ),
            Err(RouteError::Bad(_))
        ));
    }

    #[test]
    fn attributes_follow_the_kubelets_mapping() {
        let of = |method, path| attributes(method, path);
        assert_eq!(
            of("GET", "/stats/summary"),
            Attributes {
                verb: "get",
                subresource: "stats"
            }
        );
        assert_eq!(
            of("GET", "/metrics/resource"),
            Attributes {
                verb: "get",
                subresource: "metrics"
            }
        );
        assert_eq!(
            of("GET", "/containerLogs/a/b/c"),
            Attributes {
                verb: "get",
                subresource: "proxy"
            }
        );
        assert_eq!(
            of("POST", "/exec/a/b/c"),
            Attributes {
                verb: "create",
                subresource: "proxy"
            }
        );
        assert_eq!(
            of("GET", "/healthz"),
            Attributes {
                verb: "get",
                subresource: "healthz"
            }
        );
    }
}
