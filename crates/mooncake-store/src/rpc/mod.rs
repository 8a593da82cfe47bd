//! Framed RPC over TCP or Unix stream sockets, for any protocol built on
//! [`crate::proto::frame`]: the master protocol and the dummy-client
//! protocol both run on it.
//!
//! - [`stream`]: the transports ([`stream::Listener`], [`Stream`](stream::Stream)) and what a
//!   socket tells about its peer ([`Peer`], `SO_PEERCRED` on Unix sockets);
//! - [`client`]: a pooled blocking client ([`Pool`]) with connect and call
//!   timeouts, retry on a stale pooled connection, and a [`Connector`] hook
//!   for where connections go and what each does first;
//! - [`server`]: the server loop ([`Server`]): connection cap, one thread
//!   per connection, idle and frame deadlines, malformed-frame answers,
//!   buffer shrinking; a protocol plugs in as a [`Handler`];
//! - [`poll`]: when a side polls its socket before blocking on it.
//!
//! The protocol code keeps only its messages, their encoding and dispatch.
//! Public, so that a protocol outside this crate (the benchmark's floor
//! processes) runs on the same loops and socket policies as the master.

pub mod client;
pub mod poll;
pub mod server;
pub mod stream;

pub use client::{connect_any, resolve, rpc_fail, ClientOptions, Connection, Connector, Pool};
pub use server::{Handler, Server, ServerOptions, WhenFull};
pub use stream::{connect_abstract, peer_credentials, AnyStream, Peer};

#[cfg(test)]
mod tests;
