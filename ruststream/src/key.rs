//! Ordering keys: the hash `workers(n, by_key)` and `threads(n, by_key)`
//! route on.

use std::hash::{BuildHasher, Hash};

/// Hash of an ordering key. Equal keys always hash alike, so they always meet
/// the same owner; different keys that collide only share an owner (less
/// parallelism, never a broken order).
///
/// ```
/// use ruststream::subscriber::key_hash;
///
/// assert_eq!(key_hash("account-7"), key_hash("account-7"));
/// ```
pub fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(key)
}
