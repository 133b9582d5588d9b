//! Resource strings: `<namespace>/<type>/<name>` on the edge and
//! `node/<node>/<namespace>/<type>/<name>` on the cloud.

use std::fmt;
use std::str::FromStr;

/// A resource string that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// Fewer segments than `<namespace>/<type>`.
    #[error("resource {0:?} needs at least <namespace>/<type>")]
    TooShort(String),
    /// A cloud resource that does not start with `node/<node>/`.
    #[error("cloud resource {0:?} must start with node/<node>/")]
    NotANodeResource(String),
    /// A segment that must not be empty is empty.
    #[error("resource {0:?} has an empty segment")]
    EmptySegment(String),
}

/// An edge-side resource: `<namespace>/<type>[/<name>]`.
///
/// The name may itself contain `/` (device twin paths do); namespace and
/// type may not.
///
/// ```
/// use beehive::resource::{EdgeResource, CloudResource};
/// let r: EdgeResource = "default/pod/nginx".parse().unwrap();
/// assert_eq!(r.resource_type, "pod");
/// let c = r.on_node("edge-1");
/// assert_eq!(c.to_string(), "node/edge-1/default/pod/nginx");
/// assert_eq!("node/edge-1/default/pod/nginx".parse::<CloudResource>().unwrap(), c);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EdgeResource {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Resource type (see [`crate::constants::resource_type`]).
    pub resource_type: String,
    /// Object name; empty for lists.
    pub name: String,
}

impl EdgeResource {
    /// A resource from its parts.
    pub fn new(
        namespace: impl Into<String>,
        resource_type: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        EdgeResource {
            namespace: namespace.into(),
            resource_type: resource_type.into(),
            name: name.into(),
        }
    }

    /// The cloud-side form of this resource for `node`.
    pub fn on_node(&self, node: impl Into<String>) -> CloudResource {
        CloudResource {
            node: node.into(),
            resource: self.clone(),
        }
    }
}

impl fmt::Display for EdgeResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "{}/{}", self.namespace, self.resource_type)
        } else {
            write!(f, "{}/{}/{}", self.namespace, self.resource_type, self.name)
        }
    }
}

impl FromStr for EdgeResource {
    type Err = ResourceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(3, '/');
        let (Some(namespace), Some(resource_type)) = (parts.next(), parts.next()) else {
            return Err(ResourceError::TooShort(s.to_owned()));
        };
        if namespace.is_empty() || resource_type.is_empty() {
            return Err(ResourceError::EmptySegment(s.to_owned()));
        }
        Ok(EdgeResource::new(
            namespace,
            resource_type,
            parts.next().unwrap_or(""),
        ))
    }
}

/// A cloud-side resource: `node/<node>/<namespace>/<type>[/<name>]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CloudResource {
    /// The node the object belongs to.
    pub node: String,
    /// The resource as the node sees it.
    pub resource: EdgeResource,
}

impl CloudResource {
    /// The edge-side form (the `node/<node>/` prefix removed).
    pub fn to_edge(&self) -> &EdgeResource {
        &self.resource
    }
}

impl fmt::Display for CloudResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node/{}/{}", self.node, self.resource)
    }
}

impl FromStr for CloudResource {
    type Err = ResourceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("node/")
            .ok_or_else(|| ResourceError::NotANodeResource(s.to_owned()))?;
        let (node, edge) = rest
            .split_once('/')
            .ok_or_else(|| ResourceError::TooShort(s.to_owned()))?;
        if node.is_empty() {
            return Err(ResourceError::EmptySegment(s.to_owned()));
        }
        Ok(CloudResource {
            node: node.to_owned(),
            resource: edge.parse()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_resource_round_trips() {
        for s in [
            "default/pod/nginx",
            "kube-system/configmap",
            "ns/twin/dev-1/temp",
        ] {
            let r: EdgeResource = s.parse().expect(s);
            assert_eq!(r.to_string(), s);
        }
        let r: EdgeResource = "ns/twin/dev-1/temp".parse().expect("parse");
        assert_eq!(r.name, "dev-1/temp");
    }

    #[test]
    fn edge_resource_rejects_bad_shapes() {
        assert_eq!(
            "pod".parse::<EdgeResource>(),
            Err(ResourceError::TooShort("pod".into()))
        );
        assert_eq!(
            "/pod/x".parse::<EdgeResource>(),
            Err(ResourceError::EmptySegment("/pod/x".into()))
        );
        assert!("ns//x".parse::<EdgeResource>().is_err());
    }

    #[test]
    fn cloud_resource_strips_and_adds_the_node_prefix() {
        let c: CloudResource = "node/n1/default/configmap/cfg".parse().expect("parse");
        assert_eq!(c.node, "n1");
        assert_eq!(c.to_edge().to_string(), "default/configmap/cfg");
        assert_eq!(c.to_edge().on_node("n1"), c);
    }

    #[test]
    fn cloud_resource_rejects_bad_shapes() {
        assert!(matches!(
            "default/pod/x".parse::<CloudResource>(),
            Err(ResourceError::NotANodeResource(_))
        ));
        assert!(matches!(
            "node/n1".parse::<CloudResource>(),
            Err(ResourceError::TooShort(_))
        ));
        assert!(matches!(
            "node//default/pod/x".parse::<CloudResource>(),
            Err(ResourceError::EmptySegment(_))
        ));
    }
}
