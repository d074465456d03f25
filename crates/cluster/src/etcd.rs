//! The etcd v3 client: key-value reads and writes, transactions and leases
//! through etcd's JSON gateway (`/v3/...`, served on the client URL since
//! etcd 3.3). Keys and values travel base64-encoded; int64 fields come back
//! as JSON strings and zero-valued fields are left out.
//!
//! Every call is bounded by the client's timeout. Endpoints are tried in
//! turn, starting with the one that answered last; a transport failure or
//! an "unavailable" answer moves on to the next.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::Error;
use crate::http;

/// An etcd lease id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// etcd's largest lease TTL (`MaxLeaseTTL`, seconds); a longer one is not
/// an answer etcd gives.
const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// A revision of etcd's key-value store.
pub type Revision = i64;

/// A lease as etcd granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// The TTL etcd granted (it may differ from the one asked for).
    pub ttl: Duration,
}

/// One key with its value and revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (0: never).
    pub create_revision: Revision,
    /// The revision of the last write to the key.
    pub mod_revision: Revision,
    /// The lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

/// A client of one etcd cluster. Cheap to clone; clones share the
/// remembered endpoint.
#[derive(Debug, Clone)]
pub struct Etcd {
    endpoints: Arc<[String]>,
    timeout: Duration,
    preferred: Arc<AtomicUsize>,
}

/// An int64 field: a JSON string, a number, or absent (zero).
fn int(v: &Value, field: &str) -> Result<i64, Error> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| Error::BadAnswer(format!("{field} is not an integer: {s:?}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| Error::BadAnswer(format!("{field} is not an int64: {n}"))),
        Some(other) => Err(Error::BadAnswer(format!("{field} is {other}"))),
    }
}

fn bytes(v: &Value, field: &str) -> Result<Vec<u8>, Error> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => B64
            .decode(s)
            .map_err(|_| Error::BadAnswer(format!("{field} is not base64"))),
        Some(other) => Err(Error::BadAnswer(format!("{field} is {other}"))),
    }
}

fn key_value(v: &Value) -> Result<KeyValue, Error> {
    let lease = int(v, "lease")?;
    Ok(KeyValue {
        key: String::from_utf8_lossy(&bytes(v, "key")?).into_owned(),
        value: bytes(v, "value")?,
        create_revision: int(v, "create_revision")?,
        mod_revision: int(v, "mod_revision")?,
        lease: (lease != 0).then_some(LeaseId(lease)),
    })
}

fn header_revision(v: &Value) -> Result<Revision, Error> {
    int(v.get("header").unwrap_or(&Value::Null), "revision")
}

/// The end of the range of keys that start with `prefix`: the prefix with
/// its last byte below 0xff incremented (etcd's `WithPrefix`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte is 0xff (or the prefix is empty): to the end of the keyspace.
    vec![0]
}

/// The error etcd's gateway answers with: `{"error", "message", "code"}`,
/// or inside a stream `{"error": {"grpc_code", "http_code", "message"}}`.
fn etcd_error(status: u16, v: &Value) -> Error {
    let (code, message) = match v.get("error") {
        Some(Value::Object(e)) => (
            e.get("grpc_code").and_then(Value::as_i64).unwrap_or(2),
            e.get("message").and_then(Value::as_str).unwrap_or(""),
        ),
        _ => (
            v.get("code").and_then(Value::as_i64).unwrap_or(2),
            v.get("message").and_then(Value::as_str).unwrap_or(""),
        ),
    };
    if message.contains("lease not found") {
        return Error::LeaseNotFound;
    }
    Error::Etcd {
        status,
        code,
        message: message.to_string(),
    }
}

impl Etcd {
    /// A client of the etcd cluster at `endpoints` (`http://host:port` or
    /// `host:port`), each call bounded by `timeout`.
    pub fn new<S: AsRef<str>>(endpoints: &[S], timeout: Duration) -> Result<Etcd, Error> {
        if endpoints.is_empty() {
            return Err(Error::Config("no etcd endpoint".into()));
        }
        if timeout.is_zero() {
            return Err(Error::Config("etcd request timeout is zero".into()));
        }
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| http::authority(e.as_ref()).to_string())
            .collect();
        if endpoints.iter().any(String::is_empty) {
            return Err(Error::Config("empty etcd endpoint".into()));
        }
        Ok(Etcd {
            endpoints: endpoints.into(),
            timeout,
            preferred: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The same client with another per-call timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Etcd {
        Etcd {
            timeout,
            ..self.clone()
        }
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Posts `body` to `path`, trying the endpoints in turn until the
    /// timeout. Each endpoint gets an equal share of the time left, so one
    /// that stalls does not starve the others.
    fn call(&self, path: &str, body: &Value) -> Result<Value, Error> {
        let deadline = Instant::now() + self.timeout;
        let body = serde_json::to_vec(body).map_err(Error::Json)?;
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = None;
        for i in 0..n {
            let idx = (first + i) % n;
            let addr = &self.endpoints[idx];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let share = left / u32::try_from(n - i).unwrap_or(1);
            let err = match http::post(addr, path, &body, Instant::now() + share) {
                Ok(resp) => {
                    // A streaming answer (lease keepalive) is one JSON
                    // object per line; the first one is the answer.
                    let text = resp
                        .body
                        .split(|&b| b == b'\n')
                        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()));
                    let parsed = match text {
                        Some(t) => serde_json::from_slice(t),
                        None => Ok(Value::Null),
                    };
                    let v = match parsed {
                        Ok(v) => v,
                        // Not etcd's gateway (a proxy's error page, another
                        // server on the port): try the next endpoint.
                        Err(e) => {
                            let err = Error::BadAnswer(format!(
                                "HTTP {} with a body that is not JSON ({e})",
                                resp.status
                            ));
                            tracing::debug!(endpoint = %addr, path, error = %err, "etcd call failed");
                            last = Some(err);
                            continue;
                        }
                    };
                    let v = match v.get("result") {
                        Some(r) => r.clone(),
                        None => v,
                    };
                    if resp.status == 200 && v.get("error").is_none() {
                        self.preferred.store(idx, Ordering::Relaxed);
                        return Ok(v);
                    }
                    let e = etcd_error(resp.status, &v);
                    // gRPC UNAVAILABLE (14): this member cannot serve; try
                    // another. Anything else is etcd's answer.
                    if !matches!(e, Error::Etcd { code: 14, .. }) && resp.status != 503 {
                        return Err(e);
                    }
                    e
                }
                Err(e) => Error::Http(e),
            };
            tracing::debug!(endpoint = %addr, path, error = %err, "etcd call failed");
            last = Some(err);
        }
        Err(Error::Unavailable {
            timeout: self.timeout,
            last: Box::new(last.unwrap_or(Error::Http(http::HttpError::Timeout {
                addr: self.endpoints.join(","),
            }))),
        })
    }

    /// Grants a lease of `ttl` (whole seconds, at least one).
    pub fn grant(&self, ttl: Duration) -> Result<Lease, Error> {
        let secs = ttl.as_secs().max(1);
        let v = self.call("/v3/lease/grant", &json!({ "TTL": secs.to_string() }))?;
        let id = int(&v, "ID")?;
        let granted = int(&v, "TTL")?;
        if id == 0 || granted <= 0 || granted > MAX_LEASE_TTL {
            return Err(Error::BadAnswer(format!("lease grant answered {v}")));
        }
        Ok(Lease {
            id: LeaseId(id),
            ttl: Duration::from_secs(granted.unsigned_abs()),
        })
    }

    /// Renews `lease`; returns the TTL etcd restarted it with. A lease that
    /// expired or was revoked is [`Error::LeaseNotFound`].
    pub fn keepalive(&self, lease: LeaseId) -> Result<Duration, Error> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": lease.0.to_string() }))?;
        let ttl = int(&v, "TTL")?;
        if ttl <= 0 {
            return Err(Error::LeaseNotFound);
        }
        if ttl > MAX_LEASE_TTL {
            return Err(Error::BadAnswer(format!("lease TTL {ttl} s")));
        }
        Ok(Duration::from_secs(ttl.unsigned_abs()))
    }

    /// Revokes `lease`, deleting every key attached to it. A lease already
    /// gone is not an error.
    pub fn revoke(&self, lease: LeaseId) -> Result<(), Error> {
        match self.call("/v3/lease/revoke", &json!({ "ID": lease.0.to_string() })) {
            Ok(_) | Err(Error::LeaseNotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The key `key`, if present.
    pub fn get(&self, key: &str) -> Result<Option<KeyValue>, Error> {
        let v = self.call("/v3/kv/range", &json!({ "key": B64.encode(key) }))?;
        match v.get("kvs").and_then(Value::as_array) {
            Some(kvs) => kvs.first().map(key_value).transpose(),
            None => Ok(None),
        }
    }

    /// Every key that starts with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>, Error> {
        let v = self.call(
            "/v3/kv/range",
            &json!({
                "key": B64.encode(prefix),
                "range_end": B64.encode(prefix_end(prefix.as_bytes())),
            }),
        )?;
        match v.get("kvs").and_then(Value::as_array) {
            Some(kvs) => kvs.iter().map(key_value).collect(),
            None => Ok(Vec::new()),
        }
    }

    /// Writes `key`, attached to `lease` if given; returns the revision of
    /// the write.
    pub fn put(&self, key: &str, value: &[u8], lease: Option<LeaseId>) -> Result<Revision, Error> {
        let v = self.call("/v3/kv/put", &put_request(key, value, lease))?;
        header_revision(&v)
    }

    /// Writes `key` only if it does not exist (its create_revision is 0).
    /// Returns the revision of the write, or `None` if the key exists.
    pub fn create(
        &self,
        key: &str,
        value: &[u8],
        lease: Option<LeaseId>,
    ) -> Result<Option<Revision>, Error> {
        self.txn_put(key, "CREATE", "create_revision", 0, value, lease)
    }

    /// Writes `key` only if its last write was at `expected` (0: only if it
    /// does not exist). Returns the revision of the write, or `None` if the
    /// key changed since.
    pub fn compare_and_put(
        &self,
        key: &str,
        expected: Revision,
        value: &[u8],
        lease: Option<LeaseId>,
    ) -> Result<Option<Revision>, Error> {
        self.txn_put(key, "MOD", "mod_revision", expected, value, lease)
    }

    fn txn_put(
        &self,
        key: &str,
        target: &str,
        field: &str,
        expected: Revision,
        value: &[u8],
        lease: Option<LeaseId>,
    ) -> Result<Option<Revision>, Error> {
        let v = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{
                    "key": B64.encode(key),
                    "target": target,
                    "result": "EQUAL",
                    field: expected.to_string(),
                }],
                "success": [{ "request_put": put_request(key, value, lease) }],
            }),
        )?;
        // `succeeded: false` is left out of the answer.
        if v.get("succeeded").and_then(Value::as_bool).unwrap_or(false) {
            Ok(Some(header_revision(&v)?))
        } else {
            Ok(None)
        }
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool, Error> {
        let v = self.call("/v3/kv/deleterange", &json!({ "key": B64.encode(key) }))?;
        Ok(int(&v, "deleted")? > 0)
    }
}

fn put_request(key: &str, value: &[u8], lease: Option<LeaseId>) -> Value {
    let mut req = json!({ "key": B64.encode(key), "value": B64.encode(value) });
    if let Some(l) = lease {
        req["lease"] = Value::String(l.0.to_string());
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn int64_fields_as_strings_numbers_or_absent() {
        let v = json!({ "a": "42", "b": 7, "c": "x" });
        assert_eq!(int(&v, "a").ok(), Some(42));
        assert_eq!(int(&v, "b").ok(), Some(7));
        assert_eq!(int(&v, "missing").ok(), Some(0));
        assert!(int(&v, "c").is_err());
    }

    #[test]
    fn key_value_decodes_base64_and_lease() {
        let v = json!({ "key": "Zm9v", "value": "YmFy", "create_revision": "2",
                        "mod_revision": "3", "lease": "99" });
        let kv = key_value(&v).ok();
        assert_eq!(
            kv,
            Some(KeyValue {
                key: "foo".into(),
                value: b"bar".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                lease: Some(LeaseId(99)),
            })
        );
    }

    #[test]
    fn gateway_errors() {
        let v = json!({ "error": "etcdserver: requested lease not found",
                        "message": "etcdserver: requested lease not found", "code": 5 });
        assert!(matches!(etcd_error(404, &v), Error::LeaseNotFound));
        let v = json!({ "error": { "grpc_code": 14, "http_code": 503, "message": "no leader" } });
        assert!(matches!(etcd_error(503, &v), Error::Etcd { code: 14, .. }));
    }

    #[test]
    fn empty_endpoint_list_is_refused() {
        let none: [&str; 0] = [];
        assert!(Etcd::new(&none, Duration::from_secs(1)).is_err());
    }
}
