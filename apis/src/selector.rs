//! Label selectors as Kubernetes writes them in a list's `labelSelector`
//! (`app=web,tier!=cache,env in (prod,staging),!legacy,replicas>2`): parsed once,
//! then matched against objects' labels. The MetaServer, the admin API and
//! the metrics API filter with it.

use std::collections::BTreeMap;

use serde_json::Value;

/// A selector that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key=value`, `key==value`.
    Equals(String, String),
    /// `key!=value` (also met when the key is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also met when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
    /// `key>n`: the value is an integer above `n`.
    GreaterThan(String, i64),
    /// `key<n`: the value is an integer below `n`.
    LessThan(String, i64),
}

impl Requirement {
    fn matches(&self, labels: &dyn Fn(&str) -> Option<String>) -> bool {
        match self {
            Requirement::Equals(key, value) => labels(key).as_deref() == Some(value),
            Requirement::NotEquals(key, value) => labels(key).as_deref() != Some(value),
            Requirement::In(key, values) => labels(key).is_some_and(|v| values.contains(&v)),
            Requirement::NotIn(key, values) => !labels(key).is_some_and(|v| values.contains(&v)),
            Requirement::Exists(key) => labels(key).is_some(),
            Requirement::DoesNotExist(key) => labels(key).is_none(),
            Requirement::GreaterThan(key, n) => integer(labels(key)).is_some_and(|v| v > *n),
            Requirement::LessThan(key, n) => integer(labels(key)).is_some_and(|v| v < *n),
        }
    }
}

/// A label's value as an integer, if it is one.
fn integer(value: Option<String>) -> Option<i64> {
    value?.parse().ok()
}

/// A parsed label selector: every requirement must be met. The empty
/// selector selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `text`, Kubernetes' selector syntax.
    pub fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
        let error = |reason: String| SelectorError {
            selector: text.to_owned(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_requirements(text).map_err(error)? {
            requirements.push(requirement(part).map_err(error)?);
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let get = |key: &str| labels.get(key).cloned();
        self.requirements.iter().all(|r| r.matches(&get))
    }

    /// Whether the labels of `object` (`metadata.labels`) meet every
    /// requirement.
    pub fn matches_object(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |key: &str| labels.get(key).and_then(Value::as_str).map(str::to_owned);
        self.requirements.iter().all(|r| r.matches(&get))
    }
}

/// The requirements of `text`, split at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or("a ')' without its '('")?,
            ',' if depth == 0 => {
                parts.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'".to_owned());
    }
    parts.push(&text[start..]);
    let parts: Vec<&str> = parts.into_iter().map(str::trim).collect();
    if parts.len() == 1 && parts[0].is_empty() {
        return Ok(Vec::new());
    }
    if parts.iter().any(|p| p.is_empty()) {
        return Err("an empty requirement".to_owned());
    }
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (operator, build) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((key, value)) = part.split_once(operator) {
            return Ok(build(key_of(key.trim())?, value_of(value.trim())?));
        }
    }
    for (operator, build) in [
        (
            ">",
            Requirement::GreaterThan as fn(String, i64) -> Requirement,
        ),
        ("<", Requirement::LessThan),
    ] {
        if let Some((key, value)) = part.split_once(operator) {
            let value = value.trim();
            let n = value
                .parse()
                .map_err(|_| format!("{value:?} is not an integer (for {operator})"))?;
            return Ok(build(key_of(key.trim())?, n));
        }
    }
    let key_end = part.find(char::is_whitespace).unwrap_or(part.len());
    let key = key_of(&part[..key_end])?;
    let rest = part[key_end..].trim();
    if rest.is_empty() {
        return Ok(Requirement::Exists(key));
    }
    let operator_end = rest
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    let (operator, values) = (&rest[..operator_end], rest[operator_end..].trim());
    let values = values
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("{part:?}: the values go in parentheses"))?;
    let values = values
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<Vec<String>, String>>()?;
    match operator {
        "in" => Ok(Requirement::In(key, values)),
        "notin" => Ok(Requirement::NotIn(key, values)),
        other => Err(format!(
            "{other:?} is not an operator (in, notin, =, ==, !=, >, <)"
        )),
    }
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name.
fn key_of(key: &str) -> Result<String, String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_reads = prefix.is_none_or(|prefix| {
        prefix.len() <= 253
            && prefix.split('.').all(|part| {
                part.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && starts_and_ends_alphanumeric(part)
            })
    });
    if !prefix_reads || !is_name(name) {
        return Err(format!(
            "{key:?} is not a label key (an optional DNS subdomain and '/', then up to 63 of a-z, A-Z, 0-9, '-', '_', '.' beginning and ending with a letter or digit)"
        ));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or a name.
fn value_of(value: &str) -> Result<String, String> {
    if !value.is_empty() && !is_name(value) {
        return Err(format!(
            "{value:?} is not a label value (up to 63 of a-z, A-Z, 0-9, '-', '_', '.' beginning and ending with a letter or digit)"
        ));
    }
    Ok(value.to_owned())
}

/// A label's name or value: 1 to 63 letters, digits, `-`, `_`, `.`,
/// beginning and ending with a letter or digit.
fn is_name(text: &str) -> bool {
    text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && starts_and_ends_alphanumeric(text)
}

fn starts_and_ends_alphanumeric(text: &str) -> bool {
    let ends = [text.chars().next(), text.chars().next_back()];
    ends.iter()
        .all(|c| c.is_some_and(|c| c.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn requirements_match_as_kubernetes_says() {
        let web = labels(&[("app", "web"), ("env", "prod")]);
        let cache = labels(&[("app", "cache"), ("legacy", "")]);
        for (selector, on_web, on_cache) in [
            ("", true, true),
            ("app=web", true, false),
            ("app==web", true, false),
            ("app!=web", false, true),
            ("env!=prod", false, true),
            ("env in (prod, staging)", true, false),
            ("env notin (prod)", false, true),
            ("app in(web,cache)", true, true),
            ("legacy", false, true),
            ("!legacy", true, false),
            ("app=web,env=prod", true, false),
            ("app=web,!env", false, false),
            ("app in (web), env in (prod)", true, false),
            ("example.com/tier", false, false),
        ] {
            let parsed = LabelSelector::parse(selector).expect(selector);
            assert_eq!(parsed.matches(&web), on_web, "{selector} on web");
            assert_eq!(parsed.matches(&cache), on_cache, "{selector} on cache");
        }
        // Greater and less than: integer values only; absent or not an
        // integer is not met.
        let web = labels(&[("replicas", "3"), ("app", "web")]);
        let cache = labels(&[("replicas", "-1"), ("app", "cache")]);
        for (selector, on_web, on_cache) in [
            ("replicas>2", true, false),
            ("replicas > 3", false, false),
            ("replicas<0", false, true),
            ("replicas>-2", true, true),
            ("app>1", false, false),
            ("absent<100", false, false),
            ("app=web,replicas<4", true, false),
        ] {
            let parsed = LabelSelector::parse(selector).expect(selector);
            assert_eq!(parsed.matches(&web), on_web, "{selector} on web");
            assert_eq!(parsed.matches(&cache), on_cache, "{selector} on cache");
        }
    }

    #[test]
    fn an_objects_labels_are_its_metadatas() {
        let selector = LabelSelector::parse("app=web").expect("parses");
        assert!(selector.matches_object(&json!({"metadata": {"labels": {"app": "web"}}})));
        assert!(!selector.matches_object(&json!({"metadata": {"name": "x"}})));
        assert!(
            LabelSelector::parse("")
                .expect("empty")
                .matches_object(&json!({}))
        );
    }

    #[test]
    fn what_does_not_read_is_refused_with_its_reason() {
        for bad in [
            "app=web,",
            ",app",
            "env in (prod",
            "env in prod)",
            "env in prod",
            "env within (prod)",
            "a b c",
            "app=we b",
            "=web",
            "!",
            "bad key=1",
            "app=toolongtoolongtoolongtoolongtoolongtoolongtoolongtoolongtoolongtoolong",
            "replicas>two",
            "replicas<",
            "replicas>1.5",
            "Example.com/tier",
            "example..com/tier",
            "-example.com/tier",
            "/tier",
            "example.com/",
            "a/b/c",
            "app=-web",
            "app=web-",
            "_app",
        ] {
            let err = LabelSelector::parse(bad).expect_err(bad);
            assert_eq!(err.selector, bad);
            assert!(!err.reason.is_empty());
        }
    }
}
