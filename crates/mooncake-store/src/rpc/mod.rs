//! Framed RPC over TCP, for any protocol built on [`crate::proto::frame`]:
//! the master protocol and the dummy-client protocol both run on it.
//!
//! - [`client`]: a pooled blocking client ([`Pool`]) with connect and call
//!   timeouts, retry on a stale pooled connection, and a [`Connector`] hook
//!   for where connections go and what each does first;
//! - [`server`]: the server loop ([`Server`]): connection cap, one thread
//!   per connection, idle and frame deadlines, malformed-frame answers,
//!   buffer shrinking; a protocol plugs in as a [`Handler`];
//! - [`poll`]: when a side polls its socket before blocking on it.
//!
//! The protocol code keeps only its messages, their encoding and dispatch.

pub(crate) mod client;
pub(crate) mod poll;
pub(crate) mod server;

pub(crate) use client::{connect_any, rpc_fail, ClientOptions, Connection, Connector, Pool};
pub(crate) use server::{Handler, Server, ServerOptions, WhenFull};

#[cfg(test)]
mod tests;
