//! Mooncake Store: a metadata-only master and clients that move object bytes
//! directly between their buffers and segments with the transfer engine.
