//! Manifests read for apply and delete: files, directories and stdin, as one
//! YAML stream.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use anyhow::Result;

/// The manifests in `files`, one YAML stream.
pub(crate) fn read_manifests(files: &[PathBuf]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for file in files {
        if file == Path::new("-") {
            let mut text = Vec::new();
            std::io::stdin().read_to_end(&mut text)?;
            push_document(&mut out, &text);
        } else if file.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(file)
                .with_context(|| file.display().to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
                })
                .collect();
            entries.sort();
            for entry in entries {
                let text = std::fs::read(&entry).with_context(|| entry.display().to_string())?;
                push_document(&mut out, &text);
            }
        } else {
            let text = std::fs::read(file).with_context(|| file.display().to_string())?;
            push_document(&mut out, &text);
        }
    }
    Ok(out)
}

pub(crate) fn push_document(out: &mut Vec<u8>, text: &[u8]) {
    if !out.is_empty() {
        out.extend_from_slice(b"\n---\n");
    }
    out.extend_from_slice(text);
}
