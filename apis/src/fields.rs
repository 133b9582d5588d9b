//! Field selectors as kube-apiserver takes them in a list's or a watch's
//! `fieldSelector` (`metadata.name=web`, `spec.nodeName!=edge-1`, joined
//! by commas), on the fields it allows for each kind; any other field is
//! refused as kube-apiserver refuses it (`field label not supported`),
//! never ignored. kubectl sends one for `get NAME -w`, `wait` and the wait
//! after `delete`.
//!
//! One concern: which objects a field selector selects.

use serde_json::Value;

use crate::kinds::Kind;

/// A field selector that does not read, or names a field the kind does
/// not select by.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FieldSelectorError(String);

/// The fields each kind may be selected by (kube-apiserver's own sets).
fn selectable(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
        ],
        Kind::Secret => &["metadata.name", "metadata.namespace", "type"],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// A parsed field selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    /// (field path, equal or not, value).
    requirements: Vec<(&'static str, bool, String)>,
}

impl FieldSelector {
    /// Reads `text` for objects of `kind`.
    pub fn parse(text: &str, kind: Kind) -> Result<FieldSelector, FieldSelectorError> {
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((field, value)) = part.split_once("!=") {
                (field, false, value)
            } else if let Some((field, value)) = part.split_once("==") {
                (field, true, value)
            } else if let Some((field, value)) = part.split_once('=') {
                (field, true, value)
            } else {
                return Err(FieldSelectorError(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let Some(known) = selectable(kind).iter().find(|known| **known == field) else {
                return Err(FieldSelectorError(format!(
                    "field label not supported: {field}"
                )));
            };
            requirements.push((*known, equal, value.trim().to_owned()));
        }
        Ok(FieldSelector { requirements })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `object` meets every requirement (a field that is not set
    /// reads as "", as kube-apiserver reads it).
    pub fn matches_object(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(field, equal, value)| {
            let held = field
                .split('.')
                .fold(object, |at, key| &at[key])
                .as_str()
                .unwrap_or_default();
            (held == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_select_as_kube_apiserver_selects_them() {
        let pod = json!({"metadata": {"name": "web", "namespace": "shop"},
                         "spec": {"nodeName": "edge-1"}, "status": {"phase": "Running"}});
        let selects = |text: &str| {
            FieldSelector::parse(text, Kind::Pod)
                .expect("a selector")
                .matches_object(&pod)
        };
        assert!(selects("metadata.name=web"));
        assert!(selects("metadata.name==web,metadata.namespace=shop"));
        assert!(!selects("metadata.name=db"));
        assert!(selects("spec.nodeName!=edge-2,status.phase=Running"));
        assert!(
            !selects("status.podIP=10.0.0.1"),
            "an unset field reads as empty"
        );
        assert!(selects("status.podIP="));
        assert!(selects(""));
        assert_eq!(
            FieldSelector::parse("spec.nodeName=edge-1", Kind::ConfigMap),
            Err(FieldSelectorError(
                "field label not supported: spec.nodeName".to_owned()
            ))
        );
        assert!(FieldSelector::parse("metadata.name", Kind::Pod).is_err());
    }
}
