//! `connect()` honours `MC_REDIS_PASSWORD` and `MC_REDIS_DB_INDEX`. One test
//! in its own binary: it sets process environment variables.

use mooncake_common::ErrorCode;
use mooncake_transfer::metadata::{connect, MetadataUri};
use test_support::services;

#[test]
fn redis_env_vars_select_password_and_db() {
    let redis = services::start_redis(&["--requirepass", "from-env"]);
    let uri = MetadataUri::parse(&format!("redis://{}", redis.addr)).unwrap();

    std::env::remove_var("MC_REDIS_PASSWORD");
    std::env::remove_var("MC_REDIS_DB_INDEX");
    assert_eq!(
        connect(&uri).err().unwrap().code,
        ErrorCode::ERR_METADATA,
        "no password"
    );

    std::env::set_var("MC_REDIS_PASSWORD", "from-env");
    std::env::set_var("MC_REDIS_DB_INDEX", "2");
    let store = connect(&uri).unwrap();
    store.put("mooncake/rpc_meta/env", b"db2").unwrap();
    assert_eq!(
        store.get("mooncake/rpc_meta/env").unwrap().as_deref(),
        Some(&b"db2"[..])
    );

    let mut db2 = redis::Client::open(format!("redis://:from-env@{}/2", redis.addr))
        .unwrap()
        .get_connection()
        .unwrap();
    let v: Option<Vec<u8>> = redis::cmd("GET")
        .arg("mooncake/rpc_meta/env")
        .query(&mut db2)
        .unwrap();
    assert_eq!(v.as_deref(), Some(&b"db2"[..]));

    std::env::set_var("MC_REDIS_DB_INDEX", "two");
    let e = connect(&uri).err().unwrap();
    assert_eq!(e.code, ErrorCode::ERR_METADATA);
    assert!(e.context.contains("MC_REDIS_DB_INDEX"), "{e}");
    std::env::remove_var("MC_REDIS_PASSWORD");
    std::env::remove_var("MC_REDIS_DB_INDEX");
}
