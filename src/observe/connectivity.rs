//! The channel's connectivity state ([`ConnectivityState`]), as gRPC aggregates its
//! subchannels' states into its channel's, and the watch that tells it.
//!
//! The states are gRPC's
//! ([connectivity semantics](https://github.com/grpc/grpc/blob/master/doc/connectivity-semantics-and-api.md));
//! the aggregation is the one grpc-go's balancers use
//! ([`balancer.ConnectivityStateEvaluator`](https://github.com/grpc/grpc-go/blob/master/balancer/conn_state_evaluator.go)):
//! READY if any instance is ready, else CONNECTING if any is connecting, else IDLE if any is
//! idle, else TRANSIENT_FAILURE (none at all included). It is recomputed on the rare events
//! that can move it (an instance's change of state, an idle instance's first call, a
//! membership change, a discovery answer), never per call. An ejected instance reads
//! TRANSIENT_FAILURE as [A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md) shows it to its balancer, an
//! unhealthy one as [A17](https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md) does.

use crate::instance::{Instance, State};
use crate::set::Set;

/// The connectivity state of a channel, as gRPC defines it
/// ([connectivity semantics](https://github.com/grpc/grpc/blob/master/doc/connectivity-semantics-and-api.md))
/// and aggregates it over the channel's instances (grpc-go's `ClientConn.GetState`): see
/// [`BalancedChannel::connectivity`](crate::BalancedChannel::connectivity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectivityState {
    /// No instance is ready or connecting, and one at least has not been tried: its connection
    /// opens on its first call (a channel just built, without
    /// [`Builder::connect`](crate::Builder::connect)). A channel does not go back to it: it has
    /// no idle timeout (gRPC's `idleTimeout`), its instances' first connections stay open, as
    /// a tonic `Channel`'s does.
    Idle,
    /// No instance is ready, and one at least is connecting (its first calls are on their way,
    /// or its connection broke and is being opened again); or the discovery source has not
    /// answered yet.
    Connecting,
    /// One instance at least is ready: connected and answering.
    Ready,
    /// None is ready, connecting or idle: each is failing to connect, ejected or unhealthy, or
    /// discovery found none. Calls fail at once with UNAVAILABLE (wait-for-ready calls wait);
    /// the instances are tried again in the background.
    TransientFailure,
    /// Every clone of the channel was dropped (and the calls they made are over).
    Shutdown,
}

impl ConnectivityState {
    /// gRPC's name for it: `IDLE`, `CONNECTING`, `READY`, `TRANSIENT_FAILURE`, `SHUTDOWN`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectivityState::Idle => "IDLE",
            ConnectivityState::Connecting => "CONNECTING",
            ConnectivityState::Ready => "READY",
            ConnectivityState::TransientFailure => "TRANSIENT_FAILURE",
            ConnectivityState::Shutdown => "SHUTDOWN",
        }
    }

    /// What one instance adds to the channel's state. One in the set that was never sent a
    /// call is idle; one that was and is not ready yet (or any more) is connecting; one out of
    /// service is in transient failure, as gRPC's outlier ejection (gRFC A50) and health
    /// checks (gRFC A17) show their subchannels to the balancer.
    fn of(inst: &Instance) -> ConnectivityState {
        match inst.state() {
            State::Ready => ConnectivityState::Ready,
            State::Connecting if inst.started.load(std::sync::atomic::Ordering::Relaxed) == 0 => {
                ConnectivityState::Idle
            }
            State::Connecting => ConnectivityState::Connecting,
            State::Failing | State::Ejected | State::Unhealthy | State::Draining => {
                ConnectivityState::TransientFailure
            }
        }
    }
}

impl std::fmt::Display for ConnectivityState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The channel's state out of its instances' (`waiting`: the set is empty because the
/// discovery source has not answered yet).
fn aggregate(
    instances: impl Iterator<Item = ConnectivityState>,
    waiting: bool,
) -> ConnectivityState {
    use ConnectivityState::*;
    let mut best = if waiting {
        Connecting
    } else {
        TransientFailure
    };
    for state in instances {
        best = match (best, state) {
            (_, Ready) => return Ready,
            (Connecting, _) | (_, Connecting) => Connecting,
            (Idle, _) | (_, Idle) => Idle,
            _ => best,
        };
    }
    best
}

/// The channel's connectivity state, and the watch its observers hold; and whether it
/// follows other channels' (an xDS split's clusters, see [`Connectivity::follow`]) rather
/// than its own instances'.
#[derive(Debug)]
pub(crate) struct Connectivity(
    tokio::sync::watch::Sender<ConnectivityState>,
    std::sync::atomic::AtomicBool,
);

impl Default for Connectivity {
    fn default() -> Connectivity {
        Connectivity(
            tokio::sync::watch::Sender::new(ConnectivityState::Idle),
            Default::default(),
        )
    }
}

impl Connectivity {
    /// The state now.
    pub(crate) fn get(&self) -> ConnectivityState {
        *self.0.borrow()
    }

    /// A receiver of its changes.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<ConnectivityState> {
        self.0.subscribe()
    }

    /// Reads the state again from the instances of `set`. The read and the store are one step
    /// under the watch's lock, so that of two updates racing, the later one reads what the
    /// earlier saw: the state published last is computed from the instances' latest states.
    /// A channel shut down stays so.
    pub(crate) fn update(&self, set: &Set) {
        if self.1.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        self.publish(|| {
            let members = set.snapshot();
            let waiting = members.is_empty() && !*set.discovered.borrow();
            aggregate(members.iter().map(|i| ConnectivityState::of(i)), waiting)
        });
    }

    /// The state of a channel whose calls go to other channels (an xDS route's split among
    /// clusters): the best of their `states`, from now on until [`own`](Self::own).
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn follow(&self, states: impl Iterator<Item = ConnectivityState>) {
        self.1.store(true, std::sync::atomic::Ordering::Release);
        let new = aggregate(states, false);
        self.publish(|| new);
    }

    /// The state follows the channel's own instances again (`set`'s).
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn own(&self, set: &Set) {
        self.1.store(false, std::sync::atomic::Ordering::Release);
        self.update(set);
    }

    /// Publishes the state `state` computes under the watch's lock.
    fn publish(&self, state: impl FnOnce() -> ConnectivityState) {
        let mut change = None;
        self.0.send_if_modified(|now| {
            let new = state();
            let moved = *now != new && *now != ConnectivityState::Shutdown;
            if moved {
                change = Some((*now, new));
                *now = new;
            }
            moved
        });
        if let Some((from, to)) = change {
            tracing::info!(state = %to, previous.state = %from, "channel connectivity state changed");
        }
    }

    /// Every clone of the channel is gone: SHUTDOWN, for good.
    pub(crate) fn shut_down(&self) {
        self.0.send_replace(ConnectivityState::Shutdown);
    }
}

#[cfg(test)]
mod tests {
    use super::aggregate;
    use super::ConnectivityState::{self, *};

    /// grpc-go's rule, each case: READY over everything, then CONNECTING, then IDLE, then
    /// TRANSIENT_FAILURE; none at all is a failure unless discovery is still to answer.
    #[test]
    fn the_channel_takes_the_best_of_its_instances() {
        let cases: &[(&[ConnectivityState], bool, ConnectivityState)] = &[
            (&[], false, TransientFailure),
            (&[], true, Connecting),
            (&[Idle], false, Idle),
            (&[Idle, Idle], false, Idle),
            (&[Idle, Connecting], false, Connecting),
            (&[Connecting, Idle], false, Connecting),
            (&[TransientFailure, Idle], false, Idle),
            (&[TransientFailure, Connecting], false, Connecting),
            (
                &[TransientFailure, TransientFailure],
                false,
                TransientFailure,
            ),
            (&[TransientFailure, Ready], false, Ready),
            (&[Connecting, Ready, Idle], false, Ready),
            (&[Ready], false, Ready),
        ];
        for (states, waiting, want) in cases {
            assert_eq!(
                aggregate(states.iter().copied(), *waiting),
                *want,
                "{states:?} (waiting: {waiting})"
            );
        }
    }

    #[test]
    fn names_are_grpcs() {
        let names: Vec<_> = [Idle, Connecting, Ready, TransientFailure, Shutdown]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "IDLE",
                "CONNECTING",
                "READY",
                "TRANSIENT_FAILURE",
                "SHUTDOWN"
            ]
        );
    }
}
