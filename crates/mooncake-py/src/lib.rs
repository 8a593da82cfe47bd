//! The `mooncake._mooncake` extension module.
