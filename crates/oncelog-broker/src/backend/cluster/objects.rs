//! The object store that holds cluster mode's batches, and the bounded cache
//! of batches a broker keeps for fetches.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::ClusterError;
use crate::observe::histogram::Histogram;

/// Object PUT/GET counts and latencies, for /metrics.
pub struct ObjectStats {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub put_errors: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub get_errors: AtomicU64,
    pub deletes: AtomicU64,
    pub put_latency: Histogram,
    pub get_latency: Histogram,
}

impl Default for ObjectStats {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Self {
            puts: z(),
            put_bytes: z(),
            put_errors: z(),
            gets: z(),
            get_bytes: z(),
            get_errors: z(),
            deletes: z(),
            put_latency: Histogram::latency(),
            get_latency: Histogram::latency(),
        }
    }
}

/// An object store and the prefix under which this cluster keeps its objects.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// What the URL named, for `cluster info` and logs (no credentials).
    pub describe: String,
    pub stats: ObjectStats,
    /// A PUT not answered in this time fails (`cluster.put.timeout.ms`):
    /// a hung object store fails its flush, retriably, instead of holding
    /// every later flush of the broker behind it.
    put_timeout: Duration,
}

/// Where data objects live under the prefix.
const DATA_DIR: &str = "data";

impl Objects {
    /// `s3://bucket/prefix` (endpoint, region and credentials from the usual
    /// `AWS_*` environment variables) or `file:///dir` (a directory, shared
    /// by every broker; created if missing).
    pub fn from_url(url: &str) -> Result<Self, ClusterError> {
        let bad = |why: &str| ClusterError::Config(format!("object store {url}: {why}"));
        if let Some(rest) = url.strip_prefix("s3://") {
            Self::s3(url, rest)
        } else if let Some(dir) = url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
            }
            std::fs::create_dir_all(dir).map_err(|e| bad(&e.to_string()))?;
            // A PUT returns once the file and the directory entries naming
            // it are on stable storage, as an S3 PUT's answer promises: the
            // commit that follows makes the object's batches acknowledged.
            let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| bad(&e.to_string()))?
                .with_fsync(true);
            Ok(Self::new(Arc::new(store), "", url))
        } else {
            Err(bad("expected s3://bucket/prefix or file:///dir"))
        }
    }

    #[cfg(feature = "s3")]
    fn s3(url: &str, rest: &str) -> Result<Self, ClusterError> {
        let bad = |why: &str| ClusterError::Config(format!("object store {url}: {why}"));
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            // one DELETE per object: every S3-compatible server has it
            // (the bulk POST ?delete is not everywhere)
            .with_disable_bulk_delete(true)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Self::new(Arc::new(store), prefix, url))
    }

    #[cfg(not(feature = "s3"))]
    fn s3(url: &str, _rest: &str) -> Result<Self, ClusterError> {
        Err(ClusterError::Config(format!(
            "object store {url}: this build has no S3 client (feature `s3`); use file:///dir"
        )))
    }

    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, describe: &str) -> Self {
        Self {
            store,
            prefix: prefix.trim_matches('/').to_string(),
            describe: describe.to_string(),
            stats: ObjectStats::default(),
            put_timeout: Duration::from_secs(10),
        }
    }

    /// Sets how long a PUT may take before it fails.
    pub fn with_put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = timeout;
        self
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// The key of a new data object of `broker`'s `session`, `seq`-th of it.
    pub fn data_key(broker: i32, session: i64, seq: u64) -> String {
        format!("{DATA_DIR}/{broker}-{session}-{seq:012}.batches")
    }

    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), ClusterError> {
        let t = Instant::now();
        let n = data.len() as u64;
        let r = tokio::time::timeout(
            self.put_timeout,
            self.store.put(&self.path(key), PutPayload::from(data)),
        )
        .await;
        self.stats.put_latency.observe_duration(t.elapsed());
        match r {
            Ok(Ok(_)) => {
                self.stats.puts.fetch_add(1, Ordering::Relaxed);
                self.stats.put_bytes.fetch_add(n, Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(e)) => {
                self.stats.put_errors.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
            Err(_) => {
                self.stats.put_errors.fetch_add(1, Ordering::Relaxed);
                Err(ClusterError::PutTimeout {
                    key: key.to_string(),
                    after_ms: self.put_timeout.as_millis() as u64,
                })
            }
        }
    }

    pub async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, ClusterError> {
        let t = Instant::now();
        let r = self.store.get_range(&self.path(key), start..end).await;
        self.stats.get_latency.observe_duration(t.elapsed());
        match r {
            Ok(b) => {
                self.stats.gets.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .get_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                Ok(b)
            }
            Err(e) => {
                self.stats.get_errors.fetch_add(1, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), ClusterError> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.stats.deletes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Every data object's key (relative to the prefix). Nothing in the
    /// broker lists the bucket (the collector goes by PostgreSQL's rows);
    /// this is for tests and checks.
    pub async fn list_data(&self) -> Result<Vec<String>, ClusterError> {
        let dir = self.path(DATA_DIR);
        let metas: Vec<_> = self.store.list(Some(&dir)).try_collect().await?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        Ok(metas
            .into_iter()
            .map(|m| {
                let s = m.location.to_string();
                s.strip_prefix(&strip).unwrap_or(&s).to_string()
            })
            .collect())
    }

    /// A whole small object (the cluster marker); `None` when it is absent.
    pub async fn get_whole(&self, key: &str) -> Result<Option<Bytes>, ClusterError> {
        match self.store.get(&self.path(key)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether an object exists.
    pub async fn exists(&self, key: &str) -> Result<bool, ClusterError> {
        match self.store.head(&self.path(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// A round trip to the store, for health checks: lists the data folder.
    pub async fn probe(&self) -> Result<(), ClusterError> {
        let dir = self.path(DATA_DIR);
        let mut s = self.store.list(Some(&dir));
        let _ = s.try_next().await?;
        Ok(())
    }
}

/// Whole objects kept in memory, by key; the oldest inserted goes first
/// when the cache is over its bound. An object is read whole once and then
/// serves every partition's batches in it (a catching-up reader of several
/// partitions reads each object once, not once per batch).
pub struct BatchCache {
    limit: usize,
    inner: Mutex<CacheInner>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

#[derive(Default)]
struct CacheInner {
    map: HashMap<Arc<str>, Bytes>,
    order: VecDeque<Arc<str>>,
    bytes: usize,
}

impl BatchCache {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(CacheInner::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn insert(&self, key: &str, data: Bytes) {
        if data.len() > self.limit {
            return;
        }
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if c.map.contains_key(key) {
            return;
        }
        let k: Arc<str> = Arc::from(key);
        c.bytes += data.len();
        c.map.insert(k.clone(), data);
        c.order.push_back(k);
        while c.bytes > self.limit {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(b) = c.map.remove(&old) {
                c.bytes -= b.len();
            }
        }
    }

    /// The object, if cached (counted as a hit or a miss).
    pub fn get(&self, key: &str) -> Option<Bytes> {
        let r = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .get(key)
            .cloned();
        let counter = if r.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        r
    }

    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_stays_under_its_bound_dropping_the_oldest() {
        let c = BatchCache::new(100);
        for i in 0..10u64 {
            c.insert(&format!("k{i}"), Bytes::from(vec![0u8; 30]));
            assert!(c.bytes() <= 100);
        }
        assert!(c.get("k0").is_none());
        assert!(c.get("k9").is_some());
        c.insert("big", Bytes::from(vec![0u8; 101]));
        assert!(
            c.get("big").is_none(),
            "an object over the bound is not kept"
        );
    }
}
