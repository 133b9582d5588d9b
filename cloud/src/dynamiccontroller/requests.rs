//! What an application asks of the API server: the HTTP call for each
//! verb, or the watch to start. No I/O.

use serde_json::Value;

use super::watches::WatchSpec;
use super::wire::{
    ApiStatus, Application, PATCH_TYPES, PatchInfo, Reading, ResourceKey, Target, list_query,
    write_query,
};

/// An HTTP method the forwarding uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Read.
    Get,
    /// Create.
    Post,
    /// Replace.
    Put,
    /// Patch.
    Patch,
    /// Delete.
    Delete,
}

impl Method {
    /// The method's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// One call to the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    /// The method.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// The body (JSON, or a patch), empty for none.
    pub body: Vec<u8>,
    /// The body's content type.
    pub content_type: String,
    /// Whether the answer is an object or list the edge stores (a read of
    /// a resource), which passes through the answer filters.
    pub read: bool,
}

impl ApiCall {
    /// A GET of `path`; `read`: its answer is an object or list the edge
    /// stores.
    pub fn get(path: String, read: bool) -> ApiCall {
        ApiCall {
            method: Method::Get,
            path,
            body: Vec::new(),
            content_type: String::new(),
            read,
        }
    }

    fn with_body(method: Method, path: String, body: Vec<u8>, content_type: &str) -> ApiCall {
        ApiCall {
            method,
            path,
            body,
            content_type: content_type.to_owned(),
            read: false,
        }
    }
}

/// What an application comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// One call, whose answer is the application's.
    Call(ApiCall),
    /// A watch, whose changes go down the node's queue.
    Watch(WatchSpec),
}

fn with_query(path: String, query: String) -> String {
    match query.is_empty() {
        true => path,
        false => format!("{path}?{query}"),
    }
}

fn collection(key: &ResourceKey) -> ResourceKey {
    ResourceKey {
        name: None,
        ..key.clone()
    }
}

fn named(key: &ResourceKey, verb: &str) -> Result<(), ApiStatus> {
    match key.name {
        Some(_) => Ok(()),
        None => Err(ApiStatus::bad_request(format!("{verb} names no object"))),
    }
}

const JSON: &str = "application/json";

impl Request {
    /// The request `app` stands for.
    pub fn of(app: &Application) -> Result<Request, ApiStatus> {
        let key = match Target::parse(&app.key)? {
            Target::Discovery(path) if app.verb == "get" => {
                return Ok(Request::Call(ApiCall::get(path, false)));
            }
            Target::Discovery(path) => {
                return Err(ApiStatus::bad_request(format!("{path} may only be read")));
            }
            Target::Resource(key) => key,
        };
        let options = app.options()?;
        let sub = app.subresource.as_str();
        let call = match app.verb.as_str() {
            "get" => {
                named(&key, "a get")?;
                let mut query = form_urlencoded::Serializer::new(String::new());
                if let Some(version) = options["resourceVersion"]
                    .as_str()
                    .filter(|v| !v.is_empty())
                {
                    query.append_pair("resourceVersion", version);
                }
                ApiCall::get(with_query(key.path(sub)?, query.finish()), true)
            }
            "list" => {
                let path = collection(&key).path("")?;
                ApiCall::get(
                    with_query(path, list_query(&options, &key, Reading::List)),
                    true,
                )
            }
            "watch" => return Ok(Request::Watch(WatchSpec { key, options })),
            "create" => {
                // A create of a subresource (a TokenRequest, say) names its object.
                let path = match sub.is_empty() {
                    true => collection(&key).path("")?,
                    false => key.path(sub)?,
                };
                let path = with_query(path, write_query(&options));
                ApiCall::with_body(Method::Post, path, body(app)?, JSON)
            }
            "update" | "updatestatus" => {
                named(&key, "an update")?;
                let sub = if app.verb == "updatestatus" {
                    "status"
                } else {
                    sub
                };
                let path = with_query(key.path(sub)?, write_query(&options));
                ApiCall::with_body(Method::Put, path, body(app)?, JSON)
            }
            "patch" => {
                let info: PatchInfo = serde_json::from_slice(&app.option).map_err(|err| {
                    ApiStatus::bad_request(format!("unreadable PatchInfo: {err}"))
                })?;
                if !PATCH_TYPES.contains(&info.patch_type.as_str()) {
                    return Err(ApiStatus::bad_request(format!(
                        "patch type {:?} is not one of {PATCH_TYPES:?}",
                        info.patch_type
                    )));
                }
                let name = Some(info.name.clone())
                    .filter(|n| !n.is_empty())
                    .or(key.name);
                if let Some(name) = &name
                    && !super::wire::plain(name)
                {
                    return Err(ApiStatus::bad_request(format!(
                        "patch of {name:?}: not a name"
                    )));
                }
                let key = ResourceKey { name, ..key };
                named(&key, "a patch")?;
                let sub = info.subresources.as_deref().unwrap_or_default().join("/");
                let path = with_query(key.path(&sub)?, write_query(&info.options));
                ApiCall::with_body(Method::Patch, path, info.data, &info.patch_type)
            }
            "delete" => {
                named(&key, "a delete")?;
                let options = serde_json::to_vec(&options).unwrap_or_default();
                ApiCall::with_body(Method::Delete, key.path(sub)?, options, JSON)
            }
            verb => {
                return Err(ApiStatus::bad_request(format!(
                    "verb {verb:?} is not served"
                )));
            }
        };
        Ok(Request::Call(call))
    }
}

/// The object a write carries, checked to be JSON.
fn body(app: &Application) -> Result<Vec<u8>, ApiStatus> {
    serde_json::from_slice::<Value>(&app.request_body)
        .map_err(|err| ApiStatus::bad_request(format!("unreadable ReqBody: {err}")))?;
    Ok(app.request_body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(verb: &str, key: &str, option: Value, body: Option<Value>) -> Application {
        Application {
            id: "id".into(),
            key: key.into(),
            verb: verb.into(),
            option: option.to_string().into_bytes(),
            request_body: body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
            ..Application::default()
        }
    }

    fn call(app: &Application) -> ApiCall {
        match Request::of(app) {
            Ok(Request::Call(call)) => call,
            other => panic!("a call: {other:?}"),
        }
    }

    #[test]
    fn reads_become_gets() {
        let get = call(&app(
            "get",
            "/core/v1/configmaps/default/cfg",
            json!({"resourceVersion": "0"}),
            None,
        ));
        assert_eq!(
            (get.method, get.path.as_str(), get.read),
            (
                Method::Get,
                "/api/v1/namespaces/default/configmaps/cfg?resourceVersion=0",
                true
            )
        );
        let list = call(&app(
            "list",
            "/apps/v1/deployments/null/null",
            json!({"labelSelector": "a=b"}),
            None,
        ));
        assert_eq!(list.path, "/apis/apps/v1/deployments?labelSelector=a%3Db");
        let version = call(&app("get", "/version", json!({}), None));
        assert_eq!((version.path.as_str(), version.read), ("/version", false));
    }

    #[test]
    fn writes_carry_their_object() {
        let pod = json!({"metadata": {"name": "p"}});
        let create = call(&app(
            "create",
            "/core/v1/pods/default/null",
            json!({"fieldManager": "m"}),
            Some(pod.clone()),
        ));
        assert_eq!(
            (create.method, create.path.as_str()),
            (
                Method::Post,
                "/api/v1/namespaces/default/pods?fieldManager=m"
            )
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&create.body).expect("json"),
            pod
        );
        let token = Application {
            subresource: "token".into(),
            ..app(
                "create",
                "/core/v1/serviceaccounts/default/sa",
                json!({}),
                Some(json!({})),
            )
        };
        assert_eq!(
            call(&token).path,
            "/api/v1/namespaces/default/serviceaccounts/sa/token"
        );
        let status = call(&app(
            "updatestatus",
            "/core/v1/pods/default/p",
            json!({}),
            Some(pod),
        ));
        assert_eq!(
            (status.method, status.path.as_str()),
            (Method::Put, "/api/v1/namespaces/default/pods/p/status")
        );
        let delete = call(&app(
            "delete",
            "/core/v1/pods/default/p",
            json!({"gracePeriodSeconds": 0}),
            None,
        ));
        assert_eq!(
            (delete.method, delete.path.as_str()),
            (Method::Delete, "/api/v1/namespaces/default/pods/p")
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&delete.body).expect("json")["gracePeriodSeconds"],
            0
        );
    }

    #[test]
    fn a_patch_is_sent_as_its_type() {
        use base64::Engine;
        let data = base64::engine::general_purpose::STANDARD
            .encode(br#"{"metadata":{"labels":{"a":"b"}}}"#);
        let info = json!({"Name": "p", "PatchType": "application/merge-patch+json", "Data": data,
                          "Options": {"fieldManager": "m"}, "Subresources": ["status"]});
        let patch = call(&app(
            "patch",
            "/core/v1/pods/default/null",
            info.clone(),
            None,
        ));
        assert_eq!(patch.method, Method::Patch);
        assert_eq!(
            patch.path,
            "/api/v1/namespaces/default/pods/p/status?fieldManager=m"
        );
        assert_eq!(patch.content_type, "application/merge-patch+json");
        assert_eq!(patch.body, br#"{"metadata":{"labels":{"a":"b"}}}"#);
        let mut odd = info.clone();
        odd["PatchType"] = json!("text/plain");
        assert!(Request::of(&app("patch", "/core/v1/pods/default/null", odd, None)).is_err());
        // A name that would leave the object's path.
        for name in ["../secrets/x", "p?watch=1", "p/status", ".."] {
            let mut escaping = info.clone();
            escaping["Name"] = json!(name);
            let refused = Request::of(&app("patch", "/core/v1/pods/default/null", escaping, None));
            assert_eq!(refused.expect_err("refused").code, 400, "{name:?}");
        }
    }

    #[test]
    fn a_watch_is_a_watch() {
        let watch = Request::of(&app(
            "watch",
            "/core/v1/services/null/null",
            json!({"labelSelector": "x"}),
            None,
        ));
        let Ok(Request::Watch(spec)) = watch else {
            panic!("a watch: {watch:?}")
        };
        assert_eq!(spec.key.resource, "services");
        assert_eq!(spec.options["labelSelector"], "x");
    }

    #[test]
    fn unreadable_or_unserved_requests_are_refused() {
        for refused in [
            app("delete", "/version", json!({}), None),
            app("get", "/core/v1/pods/default/null", json!({}), None),
            app("update", "/core/v1/pods/default/p", json!({}), None),
            app("proxy", "/core/v1/pods/default/p", json!({}), None),
            app("get", "/core/v1/pods/default/p", json!({}), None).with_option(b"{not json"),
        ] {
            let status = Request::of(&refused).expect_err("refused");
            assert_eq!(status.code, 400, "{refused:?}");
        }
    }

    impl Application {
        fn with_option(mut self, option: &[u8]) -> Application {
            self.option = option.to_vec();
            self
        }
    }
}
