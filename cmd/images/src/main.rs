//! edgehive-images: builds the images edged's tests and the quick start use
//! as OCI image layouts (oci-spec), from binaries Debian ships, and pushes
//! them to a registry with the distribution API, so that containerd pulls
//! them through CRI PullImage like any other image.
//!
//! - `edgehive/pause:latest`: catatonit as `/pause` (run with `-P`), the
//!   pod sandbox's process.
//! - `edgehive/busybox:latest` (also `busybox:latest`): busybox-static with
//!   a link for each applet.
//!
//! ```text
//! edgehive-images --registry 127.0.0.1:5000 [--layouts DIR] [--only NAME --as REPO:TAG]
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, RootFsBuilder,
};

/// Builds edgehive's test images and pushes them to a registry.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The registry, host:port (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:5000")]
    registry: String,
    /// Where the OCI image layouts are written.
    #[arg(long, default_value = "target/oci")]
    layouts: PathBuf,
    /// Build only this image (pause or busybox).
    #[arg(long)]
    only: Option<String>,
    /// Push under this repository:tag instead of the usual names.
    #[arg(long = "as")]
    push_as: Option<String>,
}

/// One image: its files, and how it starts.
struct Recipe {
    name: &'static str,
    /// (path in the image, source on this host or a link target, is a link)
    files: Vec<(String, String, bool)>,
    /// Directories of their own (path, mode), such as a world-writable /tmp.
    dirs: Vec<(&'static str, u32)>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    tags: Vec<&'static str>,
}

fn recipes() -> Result<Vec<Recipe>> {
    let catatonit = which(&["/usr/bin/catatonit", "/usr/libexec/podman/catatonit"])?;
    let busybox = which(&["/bin/busybox", "/usr/bin/busybox"])?;
    let applets = Command::new(&busybox)
        .arg("--list")
        .output()
        .context("busybox --list")?;
    let mut files = vec![("bin/busybox".to_owned(), busybox, false)];
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        let applet = applet.trim();
        if !applet.is_empty() && applet != "busybox" {
            files.push((format!("bin/{applet}"), "busybox".to_owned(), true));
        }
    }
    Ok(vec![
        Recipe {
            name: "pause",
            files: vec![("pause".to_owned(), catatonit, false)],
            dirs: Vec::new(),
            entrypoint: vec!["/pause".to_owned(), "-P".to_owned()],
            cmd: Vec::new(),
            tags: vec!["edgehive/pause:latest"],
        },
        Recipe {
            name: "busybox",
            files,
            dirs: vec![
                ("tmp", 0o1777),
                ("etc", 0o755),
                ("root", 0o700),
                ("var", 0o755),
                ("home", 0o755),
            ],
            entrypoint: Vec::new(),
            cmd: vec!["sh".to_owned()],
            tags: vec!["edgehive/busybox:latest", "busybox:latest"],
        },
    ])
}

fn which(candidates: &[&str]) -> Result<String> {
    candidates
        .iter()
        .find(|path| Path::new(path).exists())
        .map(|path| (*path).to_owned())
        .with_context(|| {
            format!("none of {candidates:?} exists (install catatonit and busybox-static)")
        })
}

/// A blob of the image: its media type and bytes.
struct Blob {
    media_type: MediaType,
    bytes: Vec<u8>,
}

impl Blob {
    fn digest(&self) -> String {
        sha256(&self.bytes)
    }

    fn descriptor(&self) -> Result<Descriptor> {
        Ok(Descriptor::new(
            self.media_type.clone(),
            self.bytes.len() as u64,
            Digest::from_str(&self.digest())?,
        ))
    }
}

fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The image's layer (gzip tar), config and manifest.
fn build(recipe: &Recipe) -> Result<(Blob, Blob, Blob)> {
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    let mut dirs = std::collections::BTreeMap::new();
    for (path, _, _) in &recipe.files {
        if let Some(parent) = Path::new(path)
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
        {
            dirs.insert(parent.to_path_buf(), 0o755);
        }
    }
    for (dir, mode) in &recipe.dirs {
        dirs.insert(PathBuf::from(dir), *mode);
    }
    for (dir, mode) in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        tar.append_data(&mut header, &dir, std::io::empty())?;
    }
    for (path, source, link) in &recipe.files {
        let mut header = tar::Header::new_gnu();
        if *link {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            tar.append_link(&mut header, path, source)?;
        } else {
            let data = std::fs::read(source).with_context(|| source.clone())?;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o755);
            header.set_size(data.len() as u64);
            tar.append_data(&mut header, path, data.as_slice())?;
        }
    }
    let plain = tar.into_inner()?;
    let diff_id = sha256(&plain);
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&plain)?;
    let layer = Blob {
        media_type: MediaType::ImageLayerGzip,
        bytes: gzip.finish()?,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => Arch::Amd64,
        "aarch64" => Arch::ARM64,
        other => bail!("no image architecture for {other}"),
    };
    let mut config =
        ConfigBuilder::default().env(vec!["PATH=/bin:/usr/bin:/sbin:/usr/sbin".to_owned()]);
    if !recipe.entrypoint.is_empty() {
        config = config.entrypoint(recipe.entrypoint.clone());
    }
    if !recipe.cmd.is_empty() {
        config = config.cmd(recipe.cmd.clone());
    }
    let configuration = ImageConfigurationBuilder::default()
        .architecture(arch)
        .os(Os::Linux)
        .config(config.build()?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![diff_id])
                .build()?,
        )
        .build()?;
    let config = Blob {
        media_type: MediaType::ImageConfig,
        bytes: configuration.to_string()?.into_bytes(),
    };
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config.descriptor()?)
        .layers(vec![layer.descriptor()?])
        .build()?;
    let manifest = Blob {
        media_type: MediaType::ImageManifest,
        bytes: manifest.to_string()?.into_bytes(),
    };
    Ok((layer, config, manifest))
}

/// Writes an OCI image layout of the image at `dir`.
fn write_layout(dir: &Path, tag: &str, blobs: &[&Blob]) -> Result<()> {
    let blob_dir = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blob_dir)?;
    for blob in blobs {
        let digest = blob.digest();
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(blob_dir.join(hex), &blob.bytes)?;
    }
    OciLayoutBuilder::default()
        .image_layout_version("1.0.0")
        .build()?
        .to_file(dir.join("oci-layout"))?;
    let manifest = blobs.last().context("a manifest")?;
    let mut annotations = std::collections::HashMap::new();
    annotations.insert(
        "org.opencontainers.image.ref.name".to_owned(),
        tag.to_owned(),
    );
    let entry = DescriptorBuilder::default()
        .media_type(MediaType::ImageManifest)
        .size(manifest.bytes.len() as u64)
        .digest(Digest::from_str(&manifest.digest())?)
        .annotations(annotations)
        .build()?;
    ImageIndexBuilder::default()
        .schema_version(2u32)
        .manifests(vec![entry])
        .build()?
        .to_file(dir.join("index.json"))?;
    Ok(())
}

/// A plain-HTTP registry client: just what a push needs.
struct Registry {
    address: String,
}

impl Registry {
    async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Option<String>)> {
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .with_context(|| format!("registry at {}", self.address))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.address);
        if let Some(content_type) = content_type {
            request = request.header(hyper::header::CONTENT_TYPE, content_type);
        }
        let response = sender
            .send_request(request.body(Full::new(Bytes::from(body)))?)
            .await?;
        let status = response.status();
        let location = response
            .headers()
            .get(hyper::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        if !status.is_success() && status != StatusCode::NOT_FOUND {
            bail!("{path}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok((status, location))
    }

    async fn push_blob(&self, repository: &str, blob: &Blob) -> Result<()> {
        let digest = blob.digest();
        let (status, _) = self
            .call(
                Method::HEAD,
                &format!("/v2/{repository}/blobs/{digest}"),
                None,
                Vec::new(),
            )
            .await?;
        if status.is_success() {
            return Ok(());
        }
        let (_, location) = self
            .call(
                Method::POST,
                &format!("/v2/{repository}/blobs/uploads/"),
                None,
                Vec::new(),
            )
            .await?;
        let location = location.context("the registry gave no upload location")?;
        // The location may be absolute; the path is what matters.
        let path = match location.find("/v2/") {
            Some(at) => location[at..].to_owned(),
            None => location,
        };
        let separator = if path.contains('?') { '&' } else { '?' };
        self.call(
            Method::PUT,
            &format!("{path}{separator}digest={digest}"),
            Some("application/octet-stream"),
            blob.bytes.clone(),
        )
        .await?;
        Ok(())
    }

    async fn push(
        &self,
        reference: &str,
        layer: &Blob,
        config: &Blob,
        manifest: &Blob,
    ) -> Result<()> {
        let (repository, tag) = reference
            .rsplit_once(':')
            .with_context(|| format!("{reference} needs a tag"))?;
        self.push_blob(repository, layer).await?;
        self.push_blob(repository, config).await?;
        self.call(
            Method::PUT,
            &format!("/v2/{repository}/manifests/{tag}"),
            Some("application/vnd.oci.image.manifest.v1+json"),
            manifest.bytes.clone(),
        )
        .await?;
        Ok(())
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let registry = Registry {
        address: args.registry.clone(),
    };
    for recipe in recipes()? {
        if args.only.as_deref().is_some_and(|only| only != recipe.name) {
            continue;
        }
        let (layer, config, manifest) = build(&recipe)?;
        let tags: Vec<String> = match &args.push_as {
            Some(reference) => vec![reference.clone()],
            None => recipe.tags.iter().map(|t| (*t).to_owned()).collect(),
        };
        write_layout(
            &args.layouts.join(recipe.name),
            &tags[0],
            &[&layer, &config, &manifest],
        )?;
        for tag in &tags {
            runtime.block_on(registry.push(tag, &layer, &config, &manifest))?;
            println!("{}/{tag} {}", args.registry, manifest.digest());
        }
    }
    Ok(())
}
