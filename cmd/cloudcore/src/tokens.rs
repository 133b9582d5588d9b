//! `cloudcore token create|list|delete`: tokens are signed here; their
//! records live in the running cloudcore's ledger, reached through its
//! admin API.

use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use hub::certs::CloudCa;

use crate::cli::{Token, TokenAction};
use crate::config::CloudCoreConfig;

/// `cloudcore token ...`: tokens are signed here; their records live in
/// the running cloudcore's ledger, reached through its admin API.
pub(crate) fn tokens(ca: &CloudCa, settings: &CloudCoreConfig, token: Token) -> Result<()> {
    use cloud::admin::TOKENS_PATH;
    use hub::certs::{TokenRecord, TokenSpec};
    // With authentication, as the admin: the kubeconfig cloudcore wrote.
    let admin = match token.admin.as_deref().or(settings.modules.admin.enabled()) {
        None => None,
        Some(address) if address.starts_with("http://") => Some(cloud::AdminClient::new(address)),
        Some(address) if settings.modules.admin.authentication => {
            let path = settings
                .data_dir
                .join(cloud::admin_client::kubeconfig::FILE_NAME);
            match cloud::admin_client::kubeconfig::Kubeconfig::load(&path) {
                Ok(credentials) => {
                    let server = token
                        .admin
                        .as_deref()
                        .map(|a| format!("https://{}", a.trim_start_matches("https://")));
                    Some(
                        cloud::AdminClient::from_credentials(&credentials, server.as_deref())
                            .with_context(|| format!("{}", path.display()))?,
                    )
                }
                Err(_) => Some(cloud::AdminClient::new(address)),
            }
        }
        Some(address) => Some(cloud::AdminClient::new(address)),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let need_admin = || {
        admin
            .clone()
            .context("modules.admin is off: no ledger to reach")
    };
    match token.action.unwrap_or(TokenAction::Create(token.create)) {
        TokenAction::Create(create) => {
            if let Some(node) = &create.node {
                anyhow::ensure!(
                    hub::certs::valid_node_name(node),
                    "invalid node name {node:?}"
                );
            }
            let (claims, token) = ca.issue_restricted_token(&TokenSpec {
                ttl: Duration::from_secs(create.ttl_secs),
                node: create.node,
                single_use: create.single_use,
            });
            let record = TokenRecord::issued(&claims).context("a token without an id")?;
            let body = serde_json::to_vec(&record)?;
            let recorded = match &admin {
                Some(admin) => runtime
                    .block_on(admin.raw(hyper::Method::POST, TOKENS_PATH, Some(body)))
                    .map_err(anyhow::Error::from)
                    .and_then(|(status, body)| match status {
                        201 => Ok(()),
                        _ => Err(anyhow::anyhow!(
                            "{status}: {}",
                            String::from_utf8_lossy(&body)
                        )),
                    }),
                None => Err(anyhow::anyhow!("modules.admin is off")),
            };
            if let Err(err) = recorded {
                eprintln!(
                    "token {} not recorded ({err:#}): it works, but `token list` will not show it",
                    record.id
                );
            }
            println!("{token}");
            Ok(())
        }
        TokenAction::List => {
            let admin = need_admin()?;
            let (tokens, revoked) = runtime.block_on(async {
                let tokens = admin.get(TOKENS_PATH).await?;
                let revoked = admin.get(&format!("{TOKENS_PATH}/revokednodes")).await?;
                anyhow::Ok((tokens, revoked))
            })?;
            let tokens: Vec<TokenRecord> = serde_json::from_value(tokens)?;
            println!(
                "{:<18} {:<24} {:<10} {:<26} STATE",
                "ID", "NODE", "USES", "EXPIRES"
            );
            for t in tokens {
                let expires = jiff::Timestamp::from_second(t.expires.min(i64::MAX as u64) as i64)
                    .map(|at| at.to_string())
                    .unwrap_or_else(|_| "never".to_owned());
                let state = match (&t.revoked, &t.used_by) {
                    (Some(_), _) => "revoked".to_owned(),
                    (None, Some(by)) => format!("used by {by}"),
                    (None, None) => "valid".to_owned(),
                };
                let uses = if t.single_use { "once" } else { "any" };
                println!(
                    "{:<18} {:<24} {:<10} {:<26} {state}",
                    t.id,
                    t.node.as_deref().unwrap_or("<any>"),
                    uses,
                    expires
                );
            }
            for (node, revocation) in revoked["nodes"].as_object().into_iter().flatten() {
                println!(
                    "revoked node {node}: certificates issued until {} refused",
                    revocation["at"]
                        .as_i64()
                        .and_then(|at| jiff::Timestamp::from_second(at).ok())
                        .map(|at| at.to_string())
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        TokenAction::Delete { id, unrecorded } => {
            let admin = need_admin()?;
            let path = match unrecorded {
                true => format!("{TOKENS_PATH}/{id}?unrecorded=true"),
                false => format!("{TOKENS_PATH}/{id}"),
            };
            let answer = runtime.block_on(admin.delete(&path))?;
            match answer["revoked"].as_bool() {
                Some(true) => println!("token {id} revoked"),
                _ => println!("token {id} was revoked already"),
            }
            Ok(())
        }
    }
}
