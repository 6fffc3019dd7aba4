//! Membership from an xDS control plane (feature `xds`): a proxyless gRPC client's view of a
//! service mesh (Istio, Traffic Director, anything built on envoyproxy/go-control-plane), as
//! gRPC's own clients read it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tonic_balancer::Error> {
//! // GRPC_XDS_BOOTSTRAP names the bootstrap file, as for grpc-go.
//! let channel = tonic_balancer::BalancedChannel::builder()
//!     .xds("xds:///billing.prod")
//!     .build()?;
//! # let _ = channel; Ok(()) }
//! ```
//!
//! **What is read.** The bootstrap ([`Bootstrap`]: the first `xds_servers` entry, reached with
//! its first channel credentials this client supports, `insecure` or, with the feature
//! `xds-tls`, `tls` (A65: TLS, and mTLS with a client certificate); and the `node`); one ADS
//! stream per control plane, credentials and node in the process, shared by every channel that
//! names them, state of the world (A27):
//! - LDS: an API listener whose HTTP connection manager has its route configuration inline or
//!   by RDS name, the router its last filter (A39: other filters only if optional);
//! - RDS: the virtual host of the target's name (exact, suffix, prefix, then `*`); its routes
//!   by path (A28's `prefix` or `path`, `case_sensitive`), each to a cluster or to weighted
//!   clusters: each call takes the first route that matches its path and draws its cluster by
//!   weight, and goes through that cluster's own channel, retries and hedges included (see
//!   `call::split` and `split.rs`); where the first route takes every call and names one
//!   cluster, the channel's own set follows that cluster;
//! - CDS: clusters of type EDS (with `ads` or `self` config sources); the load-balancing
//!   policy (`lb_policy` ROUND_ROBIN or LEAST_REQUEST, or A52's list with round_robin,
//!   least_request, client_side_weighted_round_robin, wrr_locality of those; a cluster
//!   without a supported one is NACKed) becomes the channel's strategy, and its outlier
//!   detection (A50) its ejection rules, where the builder chose none (see `policy.rs`:
//!   round_robin runs [`Strategy::RoundRobin`](crate::Strategy::RoundRobin), least_request
//!   [`LeastPending`](crate::Strategy::LeastPending); a cluster that says nothing, the
//!   builder's default); `max_requests` (A32) caps the channel's calls in flight;
//! - EDS: the localities by priority; the endpoints HEALTHY or UNKNOWN of the most preferred
//!   priority that has any are the channel's instances; DRAINING, UNHEALTHY and the rest take
//!   no new call (those leaving drain: their calls finish); `drop_overloads` drop their share
//!   of the calls.
//!
//! ACKs and NACKs carry the version and nonce; a NACK keeps the last good resources and says
//! why in `error_detail`. A Listener or Cluster deleted, a resource not received within 15 s,
//! or a route this client cannot follow empties the set, and calls fail UNAVAILABLE naming
//! the reason. The control plane lost: calls go on over the last resources; the stream
//! reconnects with gRPC's backoff and subscribes again.
//!
//! **Not yet** (each logged where it applies, never silently): routes that match on headers,
//! a runtime fraction, a regex or query parameters (passed over), a cluster's out-of-band
//! load reports
//! (asked only where the builder turned them on), federation (A47). Locality and endpoint
//! weights weigh the tie-break's turns, not yet robustly on a busy client (`docs/xds.md`). xDS
//! security for the instances (A29) is not read either: a cluster's `transport_socket` is not
//! looked at, and the instances' TLS is the builder's (`Builder::endpoint_template`).
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md),
//! [gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md),
//! [gRFC A52](https://github.com/grpc/proposal/blob/master/A52-xds-custom-lb-policies.md),
//! [gRFC A65](https://github.com/grpc/proposal/blob/master/A65-xds-mtls-creds-in-bootstrap.md).

pub(crate) mod ads;
mod bootstrap;
mod cluster;
mod creds;
mod endpoints;
mod listener;
pub(crate) mod policy;
pub(crate) mod resolve;
pub(crate) mod split;
#[cfg(feature = "xds-tls")]
mod tls;
mod wire;

pub use bootstrap::{Bootstrap, BOOTSTRAP_CONFIG_ENV, BOOTSTRAP_FILE_ENV};

use crate::error::Error;

/// The name an `xds:` target asks the control plane for: `xds:///name` (no authority: A47's
/// federation is not supported).
pub(crate) fn target_name(target: &str) -> Result<String, Error> {
    let invalid = |reason: String| Error::InvalidSetting {
        name: "xds",
        reason,
    };
    let rest = target.strip_prefix("xds:").ok_or_else(|| {
        invalid(format!(
            "{target:?}: an xDS target is `xds:///name` (such as xds:///billing.prod)"
        ))
    })?;
    let name = match rest.strip_prefix("//") {
        Some(with_authority) => match with_authority.split_once('/') {
            Some(("", name)) => name,
            Some((authority, _)) => {
                return Err(invalid(format!(
                    "{target:?}: the authority {authority:?} asks for xDS federation (gRFC A47), \
                     which this client does not support: use `xds:///name`"
                )))
            }
            None => {
                return Err(invalid(format!(
                    "{target:?}: no name; the form is `xds:///name`"
                )))
            }
        },
        None => rest,
    };
    if name.is_empty() {
        return Err(invalid(format!(
            "{target:?}: no name; the form is `xds:///name`"
        )));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_xds_with_no_authority() {
        assert_eq!(target_name("xds:///svc.prod").unwrap(), "svc.prod");
        assert_eq!(target_name("xds:svc").unwrap(), "svc");
        for (bad, says) in [
            ("dns:///svc", "xds:///name"),
            ("xds://cp.example/svc", "federation"),
            ("xds:///", "no name"),
        ] {
            let e = target_name(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
