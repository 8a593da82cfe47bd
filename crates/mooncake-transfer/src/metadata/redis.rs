//! redis backend (`redis://host:port`): plain `GET`/`SET`/`DEL` of the key,
//! as the reference does. `MC_REDIS_PASSWORD` (AUTH) and `MC_REDIS_DB_INDEX`
//! (SELECT) are honoured; `redis://:pw@host:port/db` works too, the env vars
//! winning when both are given.
//!
//! One multiplexed connection, pipelining concurrent calls, runs on a
//! [`Driver`] runtime of this store's own: every step (connect, AUTH,
//! command) is under a tokio timeout, so a silent server cannot hang a call.
//! A dropped connection is reopened on the next call.

use std::future::Future;
use std::sync::Arc;

use ::redis::aio::MultiplexedConnection;
use ::redis::{Client, ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult};
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::driver::Driver;
use super::{MetadataStore, CONNECT_TIMEOUT, REQUEST_TIMEOUT};

/// Credentials and database, usually from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisOptions {
    pub password: Option<String>,
    pub db: Option<i64>,
}

impl RedisOptions {
    /// Reads `MC_REDIS_PASSWORD` and `MC_REDIS_DB_INDEX`.
    pub fn from_env() -> Result<RedisOptions> {
        RedisOptions::from_vars(
            std::env::var("MC_REDIS_PASSWORD").ok(),
            std::env::var("MC_REDIS_DB_INDEX").ok(),
        )
    }

    /// Empty values count as unset; a db index must be a non-negative integer.
    pub(crate) fn from_vars(
        password: Option<String>,
        db_index: Option<String>,
    ) -> Result<RedisOptions> {
        let password = password.filter(|p| !p.is_empty());
        let db = match db_index.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(s) => match s.parse::<i64>() {
                Ok(n) if n >= 0 => Some(n),
                _ => {
                    return Err(Error::new(
                        ErrorCode::ERR_METADATA,
                        format!("MC_REDIS_DB_INDEX must be a non-negative integer, got {s:?}"),
                    ))
                }
            },
        };
        Ok(RedisOptions { password, db })
    }
}

/// Connection info for `addr` (`host:port`, or anything that may follow
/// `redis://`), with `options` applied over what the address says.
pub fn connection_info(addr: &str, options: &RedisOptions) -> Result<ConnectionInfo> {
    let addr = addr.trim().trim_start_matches("redis://");
    let mut info = format!("redis://{addr}")
        .into_connection_info()
        .map_err(|e| {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("invalid redis address {addr:?}: {e}"),
            )
        })?;
    if let Some(p) = &options.password {
        info.redis.password = Some(p.clone());
    }
    if let Some(db) = options.db {
        info.redis.db = db;
    }
    Ok(info)
}

pub struct RedisStore {
    inner: Arc<Inner>,
    driver: Driver,
}

struct Inner {
    addr: String,
    client: Client,
    /// The open connection, if any; cloned per call (it multiplexes).
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl RedisStore {
    /// Connects with `MC_REDIS_PASSWORD` / `MC_REDIS_DB_INDEX` applied.
    pub(crate) fn connect(addr: &str) -> Result<RedisStore> {
        RedisStore::connect_with(addr, &RedisOptions::from_env()?)
    }

    /// Connects (AUTH and SELECT included) and checks that redis answers.
    pub fn connect_with(addr: &str, options: &RedisOptions) -> Result<RedisStore> {
        let info = connection_info(addr, options)?;
        let client = Client::open(info).map_err(|e| {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("invalid redis address {addr:?}: {e}"),
            )
        })?;
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            client,
            conn: Mutex::new(None),
        });
        let driver = Driver::start("mc-redis-metadata")?;
        let store = RedisStore { inner, driver };
        store.call("PING", |mut c| async move {
            ::redis::cmd("PING").query_async::<String>(&mut c).await
        })?;
        Ok(store)
    }

    /// Runs `op` on the shared connection, opening it first if needed. An
    /// error that means the connection broke drops it and retries once on
    /// a fresh one (GET/SET/DEL are idempotent).
    fn call<T, F, Fut>(&self, what: &'static str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(MultiplexedConnection) -> Fut + Send + 'static,
        Fut: Future<Output = RedisResult<T>> + Send + 'static,
    {
        let inner = self.inner.clone();
        self.driver.run(async move {
            let mut retried = false;
            loop {
                let conn = inner.connection().await?;
                match tokio::time::timeout(REQUEST_TIMEOUT, op(conn)).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(e)) if is_connection_error(&e) => {
                        inner.forget();
                        if !retried {
                            retried = true;
                            continue;
                        }
                        return Err(inner.error(what, e));
                    }
                    Ok(Err(e)) => return Err(inner.error(what, e)),
                    Err(_) => {
                        inner.forget();
                        return Err(Error::new(
                            ErrorCode::ERR_METADATA,
                            format!(
                                "redis {} {what}: no answer within {REQUEST_TIMEOUT:?}",
                                inner.addr
                            ),
                        ));
                    }
                }
            }
        })
    }
}

impl Inner {
    async fn connection(&self) -> Result<MultiplexedConnection> {
        if let Some(c) = self.conn.lock().clone() {
            return Ok(c);
        }
        // Bounds TCP connect, AUTH and SELECT together.
        let conn = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.client.get_multiplexed_tokio_connection(),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.error("connect", e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorCode::ERR_METADATA,
                    format!(
                        "redis {} connect: no answer within {CONNECT_TIMEOUT:?}",
                        self.addr
                    ),
                ))
            }
        };
        *self.conn.lock() = Some(conn.clone());
        Ok(conn)
    }

    fn forget(&self) {
        self.conn.lock().take();
    }

    fn error(&self, what: &str, e: RedisError) -> Error {
        Error::new(
            ErrorCode::ERR_METADATA,
            format!("redis {} {what}: {e}", self.addr),
        )
    }
}

fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
}

impl MetadataStore for RedisStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = key.to_string();
        self.call("GET", move |mut c| {
            let cmd = ::redis::cmd("GET").arg(&key).clone();
            async move { cmd.query_async::<Option<Vec<u8>>>(&mut c).await }
        })
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let cmd = ::redis::cmd("SET").arg(key).arg(value).clone();
        self.call("SET", move |mut c| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<()>(&mut c).await }
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let cmd = ::redis::cmd("DEL").arg(key).clone();
        self.call("DEL", move |mut c| {
            let cmd = cmd.clone();
            async move { cmd.query_async::<()>(&mut c).await }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_from_vars() {
        assert_eq!(
            RedisOptions::from_vars(None, None).unwrap(),
            RedisOptions::default()
        );
        assert_eq!(
            RedisOptions::from_vars(Some(String::new()), Some(" ".into())).unwrap(),
            RedisOptions::default()
        );
        assert_eq!(
            RedisOptions::from_vars(Some("pw".into()), Some("3".into())).unwrap(),
            RedisOptions {
                password: Some("pw".into()),
                db: Some(3)
            }
        );
        for bad in ["x", "-1", "1.5"] {
            let e = RedisOptions::from_vars(None, Some(bad.into())).unwrap_err();
            assert_eq!(e.code, ErrorCode::ERR_METADATA, "{bad:?}");
        }
    }

    #[test]
    fn connection_info_applies_options() {
        let info = connection_info("127.0.0.1:6379", &RedisOptions::default()).unwrap();
        assert_eq!(info.addr.to_string(), "127.0.0.1:6379");
        assert_eq!((info.redis.db, info.redis.password), (0, None));

        let info = connection_info(":secret@h:1/2", &RedisOptions::default()).unwrap();
        assert_eq!(
            (info.redis.db, info.redis.password.as_deref()),
            (2, Some("secret"))
        );

        let opts = RedisOptions {
            password: Some("env".into()),
            db: Some(5),
        };
        let info = connection_info(":secret@h:1/2", &opts).unwrap();
        assert_eq!(
            (info.redis.db, info.redis.password.as_deref()),
            (5, Some("env"))
        );

        assert!(connection_info("h:notaport", &RedisOptions::default()).is_err());
    }

    #[test]
    fn unreachable_redis_is_err_metadata() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = RedisStore::connect_with(&format!("127.0.0.1:{port}"), &RedisOptions::default())
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    }
}
