//! As in Prequal (Wydrowski et al., "Load is not what you should balance: Introducing
//! Prequal", NSDI 2024), a client asks an instance, apart from its calls, how loaded it is, and
//! the instance answers with its requests in flight (RIF) and an estimate of its latency
//! ([`ProbeAnswer`](crate::probe::ProbeAnswer)).
//!
//! The protocol is one unary gRPC method, [`PATH`](crate::probe::PATH)
//! (`/tonic_balancer.probe.v1.Probe/Probe`), whose messages are described in
//! `proto/tonic_balancer/probe/v1/probe.proto`, shipped with the crate so that a server in
//! another language can answer probes:
//!
//! ```text
//! message ProbeRequest {}
//! message ProbeResponse {
//!   uint64 requests_in_flight = 1;  // the calls it serves now, the probe not counted
//!   double latency_ms = 2;          // how long a call would take now; 0: no estimate
//! }
//! ```
//!
//! A tonic server answers probes with the `orca` feature's `OrcaLayer`, which counts its calls
//! in flight and measures their latency anyway. A probe goes straight to an instance's
//! connection: it is not a call of the channel (not picked, counted or retried), and the
//! server does not count it as one. A server without the service answers UNIMPLEMENTED.
//!
//! The messages are encoded by hand (as the ORCA reports are; the library does not depend on
//! `prost`), and [`ProbeAnswer::encode`](crate::probe::ProbeAnswer::encode) and
//! [`ProbeAnswer::decode`](crate::probe::ProbeAnswer::decode) are public for servers of one's
//! own.

use std::time::Duration;

mod client;
mod config;
mod record;
mod wire;

pub(crate) use client::{probe, ProbeError};
pub use config::ProbeConfig;
pub(crate) use record::{FreshAnswer, Record};

/// The probe's method: `/tonic_balancer.probe.v1.Probe/Probe`.
pub const PATH: &str = "/tonic_balancer.probe.v1.Probe/Probe";

/// The probe's gRPC service: `tonic_balancer.probe.v1.Probe`.
pub const SERVICE: &str = "tonic_balancer.probe.v1.Probe";

/// What an instance answered to a probe (a `tonic_balancer.probe.v1.ProbeResponse`).
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::probe::ProbeAnswer;
///
/// let answer = ProbeAnswer::new(3, Some(Duration::from_millis(12)));
/// assert_eq!(ProbeAnswer::decode(&answer.encode()), Some(answer));
/// assert_eq!(ProbeAnswer::decode(&[]), Some(ProbeAnswer::new(0, None)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ProbeAnswer {
    /// The calls the instance was serving when it answered, for every client (the probe not
    /// counted).
    pub requests_in_flight: u64,
    /// How long the instance expects a call it received then to take: its recent latency at
    /// about its requests in flight plus one. `None` when it has no estimate (`latency_ms` 0, or not a
    /// finite positive number on the wire).
    pub latency: Option<Duration>,
}

impl ProbeAnswer {
    /// An answer of `requests_in_flight` calls in flight and this latency estimate.
    pub fn new(requests_in_flight: u64, latency: Option<Duration>) -> ProbeAnswer {
        ProbeAnswer {
            requests_in_flight,
            latency,
        }
    }

    /// Decodes a serialised `ProbeResponse`; `None` if it is malformed. Unknown fields are
    /// skipped.
    pub fn decode(bytes: &[u8]) -> Option<ProbeAnswer> {
        wire::decode_answer(bytes).ok()
    }

    /// Serialises the answer as a `ProbeResponse` (protobuf wire format; fields at their
    /// default are left out). The latency goes out in milliseconds, to the nanosecond.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        wire::encode_answer(self, &mut out);
        out
    }
}

/// Whether `bytes` are a well-formed `ProbeRequest` (which has no field yet: unknown fields
/// are skipped).
#[cfg(feature = "orca")]
pub(crate) fn is_request(bytes: &[u8]) -> bool {
    wire::decode_request(bytes).is_ok()
}

/// One probe of the instance behind `channel`, given up after `timeout`: a test hook, not part
/// of the API (hidden, and free to change). The error says why, as `"Unimplemented"`,
/// `"Timeout"`, or `"Other(<code>: <message>)"`.
#[doc(hidden)]
pub async fn probe_once(
    channel: tonic::transport::Channel,
    timeout: Duration,
) -> Result<ProbeAnswer, String> {
    probe(channel, timeout).await.map_err(|e| match e {
        ProbeError::Unimplemented => "Unimplemented".to_owned(),
        ProbeError::Timeout => "Timeout".to_owned(),
        ProbeError::Other(s) => format!("Other({:?}: {})", s.code(), s.message()),
    })
}
