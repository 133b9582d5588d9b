//! Garbage collection. Containers: each pod worker keeps only the latest
//! dead container of each container (for its logs), and sandboxes of this
//! node's pods that no worker owns any more are torn down. Images: when
//! the image filesystem is fuller than `high_percent`, images no container
//! uses, unused for at least `min_age`, go, least recently seen in use
//! first, until it is below `low_percent` (the kubelet's policy). The sandbox
//! image and `pinned` images always stay.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cri::{Cri, CriError, api};

/// The image collection policy.
#[derive(Debug, Clone)]
pub struct ImageGcPolicy {
    /// Collect when the image filesystem is fuller than this (percent).
    pub high_percent: u8,
    /// Collect until it is at most this full (percent).
    pub low_percent: u8,
    /// An image unused for less than this stays.
    pub min_age: Duration,
    /// Images (by reference, as pulled) never collected.
    pub pinned: Vec<String>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_percent: 85,
            low_percent: 80,
            min_age: Duration::from_secs(120),
            pinned: Vec::new(),
        }
    }
}

/// Image collection state: when each image was last seen in use.
#[derive(Debug, Default)]
pub struct ImageCollector {
    last_used: HashMap<String, Instant>,
}

/// How full a filesystem is, in percent.
fn percent_used(mountpoint: &str) -> Option<u8> {
    let stats = rustix::fs::statvfs(mountpoint).ok()?;
    let total = stats.f_blocks.saturating_mul(stats.f_frsize);
    let free = stats.f_bavail.saturating_mul(stats.f_frsize);
    if total == 0 {
        return None;
    }
    Some(((total - free.min(total)) * 100 / total) as u8)
}

impl ImageCollector {
    /// One collection; the ids of the images removed.
    pub async fn collect(
        &mut self,
        cri: &Cri,
        policy: &ImageGcPolicy,
    ) -> Result<Vec<String>, CriError> {
        let mut images = cri.images.clone();
        let mut runtime = cri.runtime.clone();
        let now = Instant::now();
        let in_use: HashSet<String> = runtime
            .list_containers(api::ListContainersRequest { filter: None })
            .await
            .map_err(CriError::call("ListContainers"))?
            .into_inner()
            .containers
            .into_iter()
            .flat_map(|c| [c.image_ref, c.image_id])
            .filter(|id| !id.is_empty())
            .collect();
        let listed = images
            .list_images(api::ListImagesRequest { filter: None })
            .await
            .map_err(CriError::call("ListImages"))?
            .into_inner()
            .images;
        for image in &listed {
            if in_use.contains(&image.id) || !self.last_used.contains_key(&image.id) {
                self.last_used.insert(image.id.clone(), now);
            }
        }
        let ids: HashSet<&String> = listed.iter().map(|i| &i.id).collect();
        self.last_used.retain(|id, _| ids.contains(id));

        let filesystem = images
            .image_fs_info(api::ImageFsInfoRequest {})
            .await
            .map_err(CriError::call("ImageFsInfo"))?
            .into_inner();
        let mountpoint = filesystem
            .image_filesystems
            .first()
            .and_then(|fs| fs.fs_id.as_ref())
            .map(|id| id.mountpoint.clone())
            .unwrap_or_else(|| "/".to_owned());
        let usage = percent_used(&mountpoint).unwrap_or(0);
        if usage < policy.high_percent {
            return Ok(Vec::new());
        }
        // Pinned by any name the runtime knows them by.
        let mut pinned_ids = HashSet::new();
        for reference in &policy.pinned {
            let status = images
                .image_status(api::ImageStatusRequest {
                    image: Some(api::ImageSpec {
                        image: reference.clone(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await;
            if let Ok(Some(image)) = status.map(|s| s.into_inner().image) {
                pinned_ids.insert(image.id);
            }
        }
        let mut candidates: Vec<&api::Image> = listed
            .iter()
            .filter(|image| {
                !in_use.contains(&image.id) && !image.pinned && !pinned_ids.contains(&image.id)
            })
            .filter(|image| {
                !image
                    .repo_tags
                    .iter()
                    .any(|tag| policy.pinned.iter().any(|p| p == tag))
            })
            .filter(|image| {
                self.last_used
                    .get(&image.id)
                    .is_some_and(|seen| now.duration_since(*seen) >= policy.min_age)
            })
            .collect();
        candidates.sort_by_key(|image| self.last_used.get(&image.id).copied());
        let mut removed = Vec::new();
        for image in candidates {
            match images
                .remove_image(api::RemoveImageRequest {
                    image: Some(api::ImageSpec {
                        image: image.id.clone(),
                        ..Default::default()
                    }),
                })
                .await
            {
                Ok(_) => {
                    info!(image = %image.id, tags = ?image.repo_tags, "unused image removed");
                    self.last_used.remove(&image.id);
                    removed.push(image.id.clone());
                }
                Err(status) => warn!(image = %image.id, %status, "image not removed"),
            }
            if percent_used(&mountpoint).unwrap_or(0) <= policy.low_percent {
                break;
            }
        }
        Ok(removed)
    }
}
