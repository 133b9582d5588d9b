//! An etcd v3 client: the calls edgehive's cloud replicas share their
//! state through, over etcd's gRPC API.
//!
//! - **Keys and values** with revisions: [`Etcd::get`], [`Etcd::list`]
//!   (a prefix), and writes that hold only if the key is as the caller
//!   last saw it ([`Etcd::create`], [`Etcd::replace`], [`Etcd::delete`]),
//!   each a transaction comparing the key's revision.
//! - **Watches** of a prefix from a revision ([`Etcd::watch`]); a revision
//!   etcd has compacted away ends the watch with
//!   [`EtcdError::Compacted`], and the watcher lists again.
//! - **Leases** ([`Etcd::grant`], [`Etcd::keep_alive`], [`Etcd::revoke`]):
//!   keys written under a lease vanish when it expires.
//!
//! One client talks to every member it is given, spreading calls over
//! those that answer, so a member's death interrupts nothing while a
//! quorum stands.
//!
//! One concern: the etcd client, one method per etcd call edgehive makes;
//! long because those calls are many, not because it does several things.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

#[cfg(feature = "testing")]
pub mod testing;

/// etcd's generated API (KV, Watch, Lease and the rest).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    /// Keys and values.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// Users and roles.
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    /// The RPCs.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

use proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
};
use proto::mvccpb::event::EventType;

/// Why an etcd call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint is not a URL.
    #[error("etcd endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// Why it is unusable.
        reason: String,
    },
    /// No member answered, or the cluster refused (no quorum, say).
    #[error("etcd: {0}")]
    Unavailable(String),
    /// A watch asked for history etcd has compacted: list again.
    #[error("etcd compacted its history up to revision {revision}; list again")]
    Compacted {
        /// The oldest revision still kept.
        revision: i64,
    },
    /// etcd ended a watch.
    #[error("etcd ended the watch: {0}")]
    WatchEnded(String),
}

impl From<tonic::Status> for EtcdError {
    fn from(status: tonic::Status) -> Self {
        EtcdError::Unavailable(format!("{}: {}", status.code(), status.message()))
    }
}

/// What etcd calls return.
pub type Result<T> = std::result::Result<T, EtcdError>;

/// A key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// The revision of its creation.
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease it lives under (0: none).
    pub lease: i64,
}

impl From<proto::mvccpb::KeyValue> for Entry {
    fn from(kv: proto::mvccpb::KeyValue) -> Self {
        Entry {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            lease: kv.lease,
        }
    }
}

/// The outcome of a conditional write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Done, at this revision.
    Done(i64),
    /// The key was not as expected; it is this now (`None`: absent).
    Conflict(Option<Entry>),
    /// The fence the write was made under no longer holds.
    Fenced,
}

/// A key whose creation a write depends on: the write is done only while
/// the key is the one created at `create_revision` (a claim, say), so a
/// writer that has lost it writes nothing; with `create_revision` 0, only
/// while the key does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The key.
    pub key: Vec<u8>,
    /// Its creation's revision.
    pub create_revision: i64,
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key was written.
    Put(Entry),
    /// A key was removed, at `revision`; `previous` is its last value.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the removal.
        revision: i64,
        /// What it held.
        previous: Option<Entry>,
    },
}

/// The key just after every key that starts with `prefix` (etcd's
/// `range_end` of a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

/// A client of one etcd cluster.
#[derive(Clone)]
pub struct Etcd {
    members: Arc<Members>,
}

/// The members' channels, and the one that answered last.
struct Members {
    channels: Vec<Channel>,
    preferred: AtomicUsize,
}

/// Whether a failed call may go to another member: this one could not be
/// reached, has no leader, or its connection broke under the call (a
/// member killed: the connection opened before is found dead only when
/// used, as a transport error or, when it closes while the call waits,
/// hyper's "operation was canceled"). A call that timed out is not made
/// twice. A write whose member
/// died after carrying it out may so be made twice: a plain put or a
/// lease call does no harm; a conditional write then finds its condition
/// changed and says so, as when another writer came first.
fn try_another(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable => true,
        tonic::Code::Unknown => status.message().contains("transport error"),
        tonic::Code::Cancelled => status.message().contains("operation was canceled"),
        _ => false,
    }
}

impl Etcd {
    /// A client of the cluster whose members are at `endpoints`
    /// (`http://host:port`). Connections are made as calls need them.
    pub fn connect(endpoints: &[String]) -> Result<Etcd> {
        let mut members = Vec::new();
        for endpoint in endpoints {
            let member = Endpoint::from_shared(endpoint.clone())
                .map_err(|err| EtcdError::Endpoint {
                    endpoint: endpoint.clone(),
                    reason: err.to_string(),
                })?
                .connect_timeout(Duration::from_secs(2))
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            members.push(member);
        }
        if members.is_empty() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                reason: "no endpoints".to_owned(),
            });
        }
        let channels = members.into_iter().map(|m| m.connect_lazy()).collect();
        Ok(Etcd {
            members: Arc::new(Members {
                channels,
                preferred: AtomicUsize::new(0),
            }),
        })
    }

    /// Sends the next calls to the next member first: for a caller whose
    /// call timed out (a member stalled, not down, answers nothing and so
    /// is not left by itself).
    pub fn prefer_next(&self) {
        let count = self.members.channels.len();
        let current = self.members.preferred.load(Ordering::Relaxed);
        self.members
            .preferred
            .store((current + 1) % count.max(1), Ordering::Relaxed);
    }

    /// Makes `call` on the member that answered last, and on the others in
    /// turn while a member cannot be reached.
    async fn on_member<T, F, Fut>(&self, call: F) -> std::result::Result<T, tonic::Status>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let members = &self.members;
        let count = members.channels.len();
        let first = members.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for attempt in 0..count {
            let index = (first + attempt) % count;
            match call(members.channels[index].clone()).await {
                Ok(answer) => {
                    members.preferred.store(index, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(status) if try_another(&status) => {
                    failures.push(format!("member {}: {}", index + 1, status.message()));
                }
                Err(status) => return Err(status),
            }
        }
        Err(tonic::Status::unavailable(format!(
            "no member could answer ({})",
            failures.join("; ")
        )))
    }

    /// A Range call, on the first member that answers.
    async fn kv_range(&self, request: RangeRequest) -> Result<proto::etcdserverpb::RangeResponse> {
        let call = |c| {
            let request = request.clone();
            async move { KvClient::new(c).range(request).await }
        };
        Ok(self.on_member(call).await?.into_inner())
    }

    /// A Put call, on the first member that answers.
    async fn kv_put(&self, request: PutRequest) -> Result<proto::etcdserverpb::PutResponse> {
        let call = |c| {
            let request = request.clone();
            async move { KvClient::new(c).put(request).await }
        };
        Ok(self.on_member(call).await?.into_inner())
    }

    /// A Txn call, on the first member that answers.
    async fn kv_txn(&self, request: TxnRequest) -> Result<proto::etcdserverpb::TxnResponse> {
        let call = |c| {
            let request = request.clone();
            async move { KvClient::new(c).txn(request).await }
        };
        Ok(self.on_member(call).await?.into_inner())
    }

    /// The value at `key`, and the revision the answer is current at.
    pub async fn get(&self, key: &[u8]) -> Result<(Option<Entry>, i64)> {
        let request = RangeRequest {
            key: key.to_vec(),
            ..RangeRequest::default()
        };
        let answer = self.kv_range(request).await?;
        let revision = answer.header.map_or(0, |h| h.revision);
        Ok((answer.kvs.into_iter().next().map(Entry::from), revision))
    }

    /// Every key under `prefix`, in key order, and the revision the list is
    /// current at (a watch from the next one misses nothing).
    pub async fn list(&self, prefix: &[u8]) -> Result<(Vec<Entry>, i64)> {
        const PAGE: i64 = 1000;
        let end = prefix_end(prefix);
        let mut entries = Vec::new();
        let mut from = prefix.to_vec();
        let mut revision = 0;
        loop {
            let request = RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit: PAGE,
                // Every page from the first page's snapshot.
                revision,
                ..RangeRequest::default()
            };
            let answer = self.kv_range(request).await?;
            if revision == 0 {
                revision = answer.header.map_or(0, |h| h.revision);
            }
            let more = answer.more;
            let page: Vec<Entry> = answer.kvs.into_iter().map(Entry::from).collect();
            if let Some(last) = page.last() {
                from = last.key.clone();
                from.push(0);
            }
            entries.extend(page);
            if !more {
                return Ok((entries, revision));
            }
        }
    }

    /// How many keys are under `prefix` (none of them read), and the
    /// revision the count is current at.
    pub async fn count(&self, prefix: &[u8]) -> Result<(i64, i64)> {
        let request = RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            count_only: true,
            ..RangeRequest::default()
        };
        let answer = self.kv_range(request).await?;
        Ok((answer.count, answer.header.map_or(0, |h| h.revision)))
    }

    /// Writes `value` at `key` unconditionally (under `lease`, if not 0);
    /// the revision of the write.
    pub async fn put(&self, key: &[u8], value: Vec<u8>, lease: i64) -> Result<i64> {
        let request = PutRequest {
            key: key.to_vec(),
            value,
            lease,
            ..PutRequest::default()
        };
        let answer = self.kv_put(request).await?;
        Ok(answer.header.map_or(0, |h| h.revision))
    }

    /// Writes `value` at `key` if no value is there (under `lease`, if
    /// not 0).
    pub async fn create(&self, key: &[u8], value: Vec<u8>, lease: i64) -> Result<Written> {
        let put = PutRequest {
            key: key.to_vec(),
            value,
            lease,
            ..PutRequest::default()
        };
        self.write_if(key, CompareTarget::Create, 0, Op::RequestPut(put))
            .await
    }

    /// Writes `value` at `key` if its last change was at `mod_revision`,
    /// keeping its lease.
    pub async fn replace(&self, key: &[u8], value: Vec<u8>, mod_revision: i64) -> Result<Written> {
        let put = PutRequest {
            key: key.to_vec(),
            value,
            ignore_lease: true,
            ..PutRequest::default()
        };
        self.write_if(key, CompareTarget::Mod, mod_revision, Op::RequestPut(put))
            .await
    }

    /// Like [`Etcd::replace`], and only while `fence` holds.
    pub async fn replace_fenced(
        &self,
        key: &[u8],
        value: Vec<u8>,
        mod_revision: i64,
        fence: &Fence,
    ) -> Result<Written> {
        let put = PutRequest {
            key: key.to_vec(),
            value,
            ignore_lease: true,
            ..PutRequest::default()
        };
        self.txn_if(
            key,
            CompareTarget::Mod,
            mod_revision,
            Op::RequestPut(put),
            Some(fence),
        )
        .await
    }

    /// Like [`Etcd::create`] (no lease), and only while `fence` holds.
    pub async fn create_fenced(
        &self,
        key: &[u8],
        value: Vec<u8>,
        fence: &Fence,
    ) -> Result<Written> {
        let put = PutRequest {
            key: key.to_vec(),
            value,
            ..PutRequest::default()
        };
        self.txn_if(
            key,
            CompareTarget::Create,
            0,
            Op::RequestPut(put),
            Some(fence),
        )
        .await
    }

    /// Removes `key` if its last change was at `mod_revision`.
    pub async fn delete(&self, key: &[u8], mod_revision: i64) -> Result<Written> {
        let delete = DeleteRangeRequest {
            key: key.to_vec(),
            ..DeleteRangeRequest::default()
        };
        self.write_if(
            key,
            CompareTarget::Mod,
            mod_revision,
            Op::RequestDeleteRange(delete),
        )
        .await
    }

    /// Runs `op` if `key`'s `target` revision is `expected`; else reads
    /// the key as it is.
    async fn write_if(
        &self,
        key: &[u8],
        target: CompareTarget,
        expected: i64,
        op: Op,
    ) -> Result<Written> {
        self.txn_if(key, target, expected, op, None).await
    }

    /// Runs `op` if `key`'s `target` revision is `expected` (and `fence`
    /// holds); else reads the key (and the fence) as they are.
    async fn txn_if(
        &self,
        key: &[u8],
        target: CompareTarget,
        expected: i64,
        op: Op,
        fence: Option<&Fence>,
    ) -> Result<Written> {
        let target_union = match target {
            CompareTarget::Create => TargetUnion::CreateRevision(expected),
            _ => TargetUnion::ModRevision(expected),
        };
        let read = |key: &[u8]| RequestOp {
            request: Some(Op::RequestRange(RangeRequest {
                key: key.to_vec(),
                ..RangeRequest::default()
            })),
        };
        let mut compare = vec![Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            target_union: Some(target_union),
            ..Compare::default()
        }];
        let mut failure = vec![read(key)];
        if let Some(fence) = fence {
            compare.push(Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Create as i32,
                key: fence.key.clone(),
                target_union: Some(TargetUnion::CreateRevision(fence.create_revision)),
                ..Compare::default()
            });
            failure.push(read(&fence.key));
        }
        let request = TxnRequest {
            compare,
            success: vec![RequestOp { request: Some(op) }],
            failure,
        };
        let answer = self.kv_txn(request).await?;
        if answer.succeeded {
            return Ok(Written::Done(answer.header.map_or(0, |h| h.revision)));
        }
        let mut reads = answer.responses.into_iter().map(|r| match r.response {
            Some(proto::etcdserverpb::response_op::Response::ResponseRange(range)) => {
                range.kvs.into_iter().next().map(Entry::from)
            }
            _ => None,
        });
        let current = reads.next().flatten();
        if let Some(fence) = fence {
            let held = reads.next().flatten();
            let holds = match fence.create_revision {
                // The fence is that the key does not exist.
                0 => held.is_none(),
                revision => held.is_some_and(|entry| entry.create_revision == revision),
            };
            if !holds {
                return Ok(Written::Fenced);
            }
        }
        Ok(Written::Conflict(current))
    }

    /// Every change under `prefix` from revision `from` on, in revision
    /// order, a batch at a time. Ends with [`EtcdError::Compacted`] if
    /// `from` is older than etcd's history; ends when the stream does
    /// (a member went away: watch again from the next revision).
    pub async fn watch(
        &self,
        prefix: &[u8],
        from: i64,
    ) -> Result<impl Stream<Item = Result<Vec<Change>>> + Send + 'static> {
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: prefix.to_vec(),
                range_end: prefix_end(prefix),
                start_revision: from,
                prev_kv: true,
                progress_notify: true,
                ..WatchCreateRequest::default()
            })),
        };
        let (responses, requests) = self
            .on_member(|c| {
                let create = create.clone();
                async move {
                    let (requests, outgoing) = mpsc::channel(1);
                    let _ = requests.send(create).await;
                    let mut request =
                        tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
                    // A member cut off from the quorum ends the watch rather
                    // than keep it open and silent (etcd's WithRequireLeader).
                    request.metadata_mut().insert(
                        "hasleader",
                        tonic::metadata::MetadataValue::from_static("true"),
                    );
                    let responses = WatchClient::new(c).watch(request).await?.into_inner();
                    Ok((responses, requests))
                }
            })
            .await?;
        let stream = responses
            .map(move |answer| {
                // The request side stays open while the watch is read.
                let _open = &requests;
                let answer = answer?;
                if answer.compact_revision > 0 {
                    return Err(EtcdError::Compacted {
                        revision: answer.compact_revision,
                    });
                }
                if answer.canceled {
                    return Err(EtcdError::WatchEnded(answer.cancel_reason));
                }
                let changes = answer
                    .events
                    .into_iter()
                    .filter_map(|event| {
                        let kv = event.kv?;
                        Some(match EventType::try_from(event.r#type) {
                            Ok(EventType::Delete) => Change::Delete {
                                revision: kv.mod_revision,
                                key: kv.key,
                                previous: event.prev_kv.map(Entry::from),
                            },
                            _ => Change::Put(Entry::from(kv)),
                        })
                    })
                    .collect::<Vec<_>>();
                Ok(changes)
            })
            .take_while(|item| {
                let go_on = !matches!(item, Err(EtcdError::WatchEnded(_)));
                async move { go_on }
            })
            // The watch's creation and progress notes carry no change.
            .filter(|item| {
                let keep = !matches!(item, Ok(changes) if changes.is_empty());
                async move { keep }
            });
        Ok(stream)
    }

    /// Drops history up to `revision`: watches from before it fail with
    /// [`EtcdError::Compacted`].
    pub async fn compact(&self, revision: i64) -> Result<()> {
        let request = proto::etcdserverpb::CompactionRequest {
            revision,
            physical: true,
        };
        self.on_member(|c| async move { KvClient::new(c).compact(request).await })
            .await?;
        Ok(())
    }

    /// A lease of `ttl`; its id.
    pub async fn grant(&self, ttl: Duration) -> Result<i64> {
        let request = LeaseGrantRequest {
            ttl: ttl.as_secs().max(1) as i64,
            id: 0,
        };
        let answer = self
            .on_member(|c| async move { LeaseClient::new(c).lease_grant(request).await })
            .await?
            .into_inner();
        if !answer.error.is_empty() {
            return Err(EtcdError::Unavailable(answer.error));
        }
        Ok(answer.id)
    }

    /// Renews `lease` once; its time to live now, or `None` if it has
    /// expired (its keys are gone).
    pub async fn keep_alive(&self, lease: i64) -> Result<Option<Duration>> {
        let mut answers = self
            .on_member(|c| async move {
                let once = futures_util::stream::iter([LeaseKeepAliveRequest { id: lease }]);
                LeaseClient::new(c).lease_keep_alive(once).await
            })
            .await?
            .into_inner();
        match answers.next().await {
            Some(answer) => {
                let ttl = answer?.ttl;
                Ok((ttl > 0).then(|| Duration::from_secs(ttl as u64)))
            }
            None => Err(EtcdError::Unavailable("no keepalive answer".to_owned())),
        }
    }

    /// Ends `lease` now: its keys are removed.
    pub async fn revoke(&self, lease: i64) -> Result<()> {
        self.on_member(|c| async move {
            LeaseClient::new(c)
                .lease_revoke(LeaseRevokeRequest { id: lease })
                .await
        })
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
