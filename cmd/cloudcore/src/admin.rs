//! The admin API's side of start-up: the names its certificate is for, the
//! URL a kubeconfig points at, how it knows its callers, and the admin's
//! kubeconfig.

use std::time::Duration;

use anyhow::Context as _;
use anyhow::Result;
use hub::certs::CloudCa;
use transports::tls;

use crate::config::CloudCoreConfig;
use crate::replicas::replica_url;

/// The address kube-apiserver reaches this cloudcore at, when none is
/// configured: with replicas each must name itself (the API server must
/// reach this replica, not a shared address), in a pod its IP; else the
/// first IP of `cloudHub.advertiseAddress` (an InternalIP is one), else its
/// first name.
pub(crate) fn advertised_host(settings: &CloudCoreConfig) -> Option<String> {
    let pod_ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty());
    if settings.replicas.enable && pod_ip.is_some() {
        return pod_ip;
    }
    let names = &settings.modules.cloud_hub.advertise_address;
    names
        .iter()
        .find(|name| name.parse::<std::net::IpAddr>().is_ok())
        .or(names.first())
        .cloned()
}

/// The admin API's server certificate names: the cloud's advertised
/// names and the host it listens on (unless that is every address).
pub(crate) fn admin_names(settings: &CloudCoreConfig) -> Vec<String> {
    let mut names = settings.modules.cloud_hub.advertise_address.clone();
    // The address the other replicas reach it at.
    if let Some(url) = replica_url(settings) {
        let host = url.split("://").nth(1).unwrap_or(&url);
        let host = match host.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => host,
            _ => host,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if !host.is_empty() && !names.iter().any(|n| n == host) {
            names.push(host.to_owned());
        }
    }
    if let Some((host, _)) = settings.modules.admin.address.rsplit_once(':') {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let every = host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified());
        if !every && !host.is_empty() && !names.iter().any(|n| n == host) {
            names.push(host.to_owned());
        }
    }
    names
}

/// The admin API's URL as a kubeconfig names it: its listen address, or
/// the first advertised name at its port when it listens on every address.
pub(crate) fn admin_server_url(settings: &CloudCoreConfig) -> String {
    let address = &settings.modules.admin.address;
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "10003"));
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let host = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => settings
            .modules
            .cloud_hub
            .advertise_address
            .first()
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".to_owned()),
        _ => bare.to_owned(),
    };
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// The admin API's TLS (the CA's server certificate; client certificates
/// of the CA verified when presented) and its bearer tokens.
pub(crate) fn admin_auth(
    settings: &CloudCoreConfig,
    ca: &CloudCa,
) -> Result<cloud::admin::AdminAuth> {
    let (chain, key) =
        ca.issue_server(&admin_names(settings), Duration::from_secs(365 * 24 * 3600))?;
    let tls = tls::server_config_optional_client_auth(chain, key, &[ca.root()])?;
    let file = &settings.modules.admin.token_file;
    let tokens = if file.as_os_str().is_empty() {
        cloud::admin::auth::Tokens::none()
    } else {
        let tokens = cloud::admin::auth::Tokens::read(file).context("modules.admin.tokenFile")?;
        tracing::info!(file = %file.display(), tokens = tokens.len(), "admin API bearer tokens");
        tokens
    };
    Ok(cloud::admin::AdminAuth { tls, tokens })
}

/// A kubeconfig for `user` in `group`, a client certificate of the CA
/// valid for `days`.
pub(crate) fn admin_kubeconfig(
    ca: &CloudCa,
    server: &str,
    user: &str,
    group: &str,
    days: u64,
) -> Result<String> {
    anyhow::ensure!(!user.is_empty(), "--user: a name");
    let identity = ca.issue_client(user, group, Duration::from_secs(days * 24 * 3600))?;
    let kubeconfig = cloud::admin_client::kubeconfig::Kubeconfig::with_certificate(
        "edgehive",
        server,
        &ca.root(),
        user,
        &identity,
    );
    Ok(kubeconfig.to_yaml()?)
}

/// The admin's certificates' lifetime in the kubeconfig written at first
/// start, in days.
pub(crate) const ADMIN_DAYS: u64 = 5 * 365;

/// Writes `<dataDir>/admin.kubeconfig` (readable by its owner only) for
/// user `admin` in `edgehive:admins`, unless it is there already.
pub(crate) fn write_admin_kubeconfig(settings: &CloudCoreConfig, ca: &CloudCa) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = settings
        .data_dir
        .join(cloud::admin_client::kubeconfig::FILE_NAME);
    if path.exists() {
        return Ok(());
    }
    let text = admin_kubeconfig(
        ca,
        &admin_server_url(settings),
        "admin",
        cloud::admin::auth::ADMINS,
        ADMIN_DAYS,
    )?;
    let partial = path.with_extension("kubeconfig.partial");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| partial.display().to_string())?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| partial.display().to_string())?;
    std::fs::rename(&partial, &path).with_context(|| path.display().to_string())?;
    tracing::info!(path = %path.display(), "admin kubeconfig written (edgehivectl --kubeconfig)");
    Ok(())
}
