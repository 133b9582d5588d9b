//! Container logs: read as the kubelet's `/containerLogs` gives them, and
//! rotated by size and count as the kubelet rotates them.
//!
//! A container's log as the kubelet's `/containerLogs` gives it, from the
//! file the runtime writes (`<log dir>/<container>/<attempt>.log`, CRI
//! format: `<RFC 3339 time> <stdout|stderr> <F|P> <text>`, `P` a part of a
//! line the next record continues).
//!
//! [`LogFilter`] decides which lines go and how (tail, since, timestamps,
//! byte limit) as plain code; [`serve`] reads the file, and with `follow`
//! keeps reading what is appended, across a rotation (the file renamed
//! away and a new one made at its path: the old one is finished first).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apis::streams::{LogOptions, channel};
use bytes::Bytes;
use stream::PendingStream;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// How often a followed log is looked at for more.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// One record of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its time, as written (RFC 3339 with nanoseconds).
    pub time: &'a str,
    /// Whether it is a whole line's end (`F`), not a part (`P`).
    pub full: bool,
    /// The text.
    pub text: &'a str,
}

/// Reads one record; `None` for a line that is not one.
pub fn record(line: &str) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    if !matches!(stream, "stdout" | "stderr") {
        return None;
    }
    let full = match tag.split(':').next()? {
        "F" => true,
        "P" => false,
        _ => return None,
    };
    Some(Record {
        time,
        full,
        text: parts.next().unwrap_or(""),
    })
}

/// Which lines of a log go, and how: the kubelet's options, decided line
/// by line (time passed in as the lines' own times).
#[derive(Debug)]
pub struct LogFilter {
    since: Option<jiff::Timestamp>,
    timestamps: bool,
    /// Bytes still allowed (`None`: no limit).
    budget: Option<u64>,
    /// A line being put together from parts: its first part's time.
    partial: Option<(String, String)>,
    /// Records that were not CRI records.
    pub garbled: u64,
}

impl LogFilter {
    /// A filter for `options`, `now` being the time `sinceSeconds` counts
    /// back from.
    pub fn new(options: &LogOptions, now: jiff::Timestamp) -> Result<LogFilter, String> {
        let since = match (&options.since_time, options.since_seconds) {
            (Some(time), _) => Some(
                time.parse::<jiff::Timestamp>()
                    .map_err(|err| format!("sinceTime {time:?}: {err}"))?,
            ),
            (None, Some(seconds)) => Some(
                now.checked_sub(jiff::SignedDuration::from_secs(seconds.max(0)))
                    .map_err(|err| err.to_string())?,
            ),
            (None, None) => None,
        };
        Ok(LogFilter {
            since,
            timestamps: options.timestamps,
            budget: options.limit_bytes.map(|limit| limit.max(0) as u64),
            partial: None,
            garbled: 0,
        })
    }

    /// The output for one line of the file (without its newline): a whole
    /// log line once its last part came, if it is to go.
    pub fn line(&mut self, line: &str) -> Option<String> {
        let Some(record) = record(line) else {
            self.garbled += 1;
            return None;
        };
        let (time, mut text) = match self.partial.take() {
            Some((time, text)) => (time, text),
            None => (record.time.to_owned(), String::new()),
        };
        text.push_str(record.text);
        if !record.full {
            self.partial = Some((time, text));
            return None;
        }
        if let Some(since) = self.since {
            let at = time.parse::<jiff::Timestamp>().ok()?;
            if at < since {
                return None;
            }
        }
        Some(match self.timestamps {
            true => format!("{time} {text}\n"),
            false => format!("{text}\n"),
        })
    }

    /// Takes `output` within the byte limit: what may go (cut at the
    /// limit), and whether the limit is reached.
    pub fn limit(&mut self, output: String) -> (String, bool) {
        let Some(budget) = self.budget.as_mut() else {
            return (output, false);
        };
        let mut output = output;
        if output.len() as u64 >= *budget {
            let mut cut = *budget as usize;
            while !output.is_char_boundary(cut) {
                cut -= 1;
            }
            output.truncate(cut);
            *budget = 0;
            return (output, true);
        }
        *budget -= output.len() as u64;
        (output, false)
    }
}

/// The log file of the container's latest attempt (or the one before,
/// for `previous`) in `dir`.
pub fn log_file(dir: &Path, previous: bool) -> Option<PathBuf> {
    let mut attempts: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let attempt: u32 = name.strip_suffix(".log")?.parse().ok()?;
            Some((attempt, entry.path()))
        })
        .collect();
    attempts.sort();
    let skip = usize::from(previous);
    attempts.into_iter().rev().nth(skip).map(|(_, path)| path)
}

/// Serves a container's log (its log directory `dir`) on the stream, on
/// stdout: refused if there is none; then the lines `options` select;
/// with `follow`, what is written after, until the stream is closed.
pub async fn serve(dir: &Path, options: LogOptions, pending: PendingStream) {
    let Some(path) = log_file(dir, options.previous) else {
        let which = if options.previous { "previous " } else { "" };
        return pending.refuse(&format!("no {which}log of this container on the node"));
    };
    let mut filter = match LogFilter::new(&options, jiff::Timestamp::now()) {
        Ok(filter) => filter,
        Err(reason) => return pending.refuse(&reason),
    };
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(err) => return pending.refuse(&format!("the log: {err}")),
    };
    let Ok(stream) = pending.accept() else {
        return;
    };
    let writer = stream.writer();
    // What is there now, filtered and tailed.
    let mut text = Vec::new();
    if file.read_to_end(&mut text).await.is_err() {
        return stream.fail("the log could not be read");
    }
    let whole = text
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |end| end + 1);
    let mut carry = text.split_off(whole);
    let mut lines: VecDeque<String> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| filter.line(line))
        .collect();
    if let Some(tail) = options.tail_lines {
        let keep = usize::try_from(tail.max(0)).unwrap_or(usize::MAX);
        while lines.len() > keep {
            lines.pop_front();
        }
    }
    let mut out = String::new();
    for line in lines {
        let (line, full) = filter.limit(line);
        out.push_str(&line);
        if full {
            let _ = writer.send(channel::STDOUT, Bytes::from(out)).await;
            return stream.close();
        }
    }
    if !out.is_empty()
        && writer
            .send(channel::STDOUT, Bytes::from(out))
            .await
            .is_err()
    {
        return;
    }
    if !options.follow {
        return stream.close();
    }
    // Following: what is appended, and the next file after a rotation.
    let mut stream = stream;
    let mut position = whole as u64 + carry.len() as u64;
    let mut inode = inode_of(&path).await;
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            end = stream.recv() => match end {
                // The cloud's side ended (the client went away).
                None | Some(Err(_)) => return,
                Some(Ok(_)) => continue,
            },
        }
        let mut more = Vec::new();
        if file.seek(std::io::SeekFrom::Start(position)).await.is_err()
            || file.read_to_end(&mut more).await.is_err()
        {
            return stream.fail("the log could not be read");
        }
        position += more.len() as u64;
        let rotated = match inode_of(&path).await {
            now if now != inode && more.is_empty() => {
                // Renamed away and drained: the new file at the path.
                match tokio::fs::File::open(&path).await {
                    Ok(next) => {
                        file = next;
                        position = 0;
                        inode = now;
                        true
                    }
                    Err(_) => false,
                }
            }
            _ => false,
        };
        if more.is_empty() && !rotated {
            continue;
        }
        carry.extend_from_slice(&more);
        let whole = carry
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |end| end + 1);
        let rest = carry.split_off(whole);
        let mut out = String::new();
        let mut full = false;
        for line in String::from_utf8_lossy(&carry).lines() {
            if let Some(line) = filter.line(line) {
                let (line, reached) = filter.limit(line);
                out.push_str(&line);
                if reached {
                    full = true;
                    break;
                }
            }
        }
        carry = rest;
        if !out.is_empty()
            && stream
                .send(channel::STDOUT, Bytes::from(out))
                .await
                .is_err()
        {
            return;
        }
        if full {
            return stream.close();
        }
    }
}

async fn inode_of(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    tokio::fs::metadata(path).await.ok().map(|m| m.ino())
}

/// How container logs rotate: the kubelet's containerLogMaxSize and
/// containerLogMaxFiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// A log reaching this size is rotated.
    pub max_size: u64,
    /// Files kept per container, the one being written included (at
    /// least 2).
    pub max_files: usize,
    /// How often the logs are looked at.
    pub every: Duration,
}

impl Default for Rotation {
    /// The kubelet's defaults: 10 MiB, 5 files; looked at every 10 s.
    fn default() -> Rotation {
        Rotation {
            max_size: 10 << 20,
            max_files: 5,
            every: Duration::from_secs(10),
        }
    }
}

/// What to do with one container's log files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationPlan {
    /// Rename the file being written (and have the runtime reopen it).
    pub rotate: bool,
    /// Rotated files to delete, oldest first.
    pub delete: Vec<String>,
}

/// Decides one container's rotation: the file being written is `size`
/// bytes; `rotated` are its earlier files' names (`<log>.<time>`, so
/// their order is their age).
pub fn plan(size: u64, rotated: &[String], limits: &Rotation) -> RotationPlan {
    let rotate = size >= limits.max_size;
    let mut rotated: Vec<&String> = rotated.iter().collect();
    rotated.sort();
    // After a rotation one more is rotated; the one written counts too.
    let keep = limits.max_files.max(2) - 1 - usize::from(rotate);
    let excess = rotated.len().saturating_sub(keep);
    RotationPlan {
        rotate,
        delete: rotated[..excess]
            .iter()
            .map(|name| (*name).clone())
            .collect(),
    }
}

/// Reads a size as the kubelet's configuration writes it (`10Mi`, `512Ki`,
/// `1G`, `4096`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (such as 10Mi)"))?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// One pass over the running containers' logs: each one over the size is
/// renamed to `<log>.<time>` and the runtime told to reopen it (CRI
/// `ReopenContainerLog`; renamed back if it cannot); rotated files beyond
/// the count are deleted. What was rotated and deleted.
pub async fn rotate(
    cri: &crate::Cri,
    pods: &crate::server::PodsView,
    root: &Path,
    limits: &Rotation,
) -> (usize, usize) {
    let containers: Vec<(PathBuf, String)> = pods
        .read()
        .map(|pods| {
            pods.values()
                .flat_map(|pod| {
                    let dir = root
                        .join("pods")
                        .join(crate::spec::pod_uid(pod))
                        .join("logs");
                    pod.status
                        .iter()
                        .flat_map(|s| s.container_statuses.iter().flatten())
                        .filter(|s| s.state.as_ref().is_some_and(|s| s.running.is_some()))
                        .filter_map(move |s| {
                            let id = s.container_id.as_deref()?;
                            let id = id.rsplit_once("://").map_or(id, |(_, id)| id);
                            Some((dir.join(&s.name), id.to_owned()))
                        })
                })
                .collect()
        })
        .unwrap_or_default();
    let (mut rotated, mut deleted) = (0, 0);
    for (dir, container) in containers {
        let Some(current) = log_file(&dir, false) else {
            continue;
        };
        let Some(name) = current
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
        else {
            continue;
        };
        let Ok(size) = tokio::fs::metadata(&current).await.map(|m| m.len()) else {
            continue;
        };
        let earlier: Vec<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                    .filter(|file| file.starts_with(&format!("{name}.")))
                    .collect()
            })
            .unwrap_or_default();
        let plan = plan(size, &earlier, limits);
        // The oldest go first: never more files than the count, even for
        // a moment.
        for file in &plan.delete {
            if tokio::fs::remove_file(dir.join(file)).await.is_ok() {
                deleted += 1;
            }
        }
        if plan.rotate {
            let time = jiff::Zoned::now().strftime("%Y%m%d-%H%M%S%.f").to_string();
            let renamed = dir.join(format!("{name}.{time}"));
            if tokio::fs::rename(&current, &renamed).await.is_err() {
                continue;
            }
            let mut runtime = cri.runtime.clone();
            let reopened = runtime
                .reopen_container_log(crate::cri::api::ReopenContainerLogRequest {
                    container_id: container.clone(),
                })
                .await;
            if let Err(status) = reopened {
                tracing::warn!(%container, error = %status.message(), "log not reopened; rotation undone");
                let _ = tokio::fs::rename(&renamed, &current).await;
                continue;
            }
            rotated += 1;
        }
    }
    (rotated, deleted)
}

#[cfg(test)]
mod tests;
