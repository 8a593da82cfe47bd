//! The master RPC protocol: messages ([`Request`], [`Response`]), their
//! compact binary encoding ([`wire`]) and framing ([`frame`]).
//!
//! A connection carries one request frame and then one response frame per
//! call; clients keep connections open and reuse them.

pub mod frame;
pub mod messages;
pub mod wire;

pub use frame::{decode_payload, encode_frame, MAX_FRAME_LEN, PROTOCOL_VERSION};
pub use messages::{Frames, Request, Response};
pub use wire::{Decode, DecodeError, Encode};
