//! The strategies a user chooses among ([`Strategy`]); each one's pick is a file of this
//! module (see the module docs). Weighted round robin is gRPC's
//! [A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md).

/// How the channel chooses the instance for a call. All of them skip instances that are
/// failing, ejected, unhealthy or draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Fewest calls in flight first, and among near ties the instance expected to answer
    /// sooner. The default.
    ///
    /// Each call in flight counts one, except on an instance that answered markedly slower
    /// than the rest twice in a row (more than twice its method's usual time, compared on the
    /// same method; one slow answer alone is the tail every instance has): until it is
    /// re-checked, each of its calls counts its slowness, at most 4.5. The lowest
    /// count, with the call to be sent (calls in flight plus one, weighed so), wins, and equal
    /// counts take turns as in [`LeastPending`](Strategy::LeastPending). So among equally fast
    /// instances this is least pending exactly; an instance that has answered twenty times
    /// slower with one, two or three calls fewer than the others loses; and an instance whose
    /// calls in flight plus one are more than 4.5 times the fewest plus one never wins, however
    /// slow the one with the fewest has been. A slow instance is re-checked with one call at a
    /// time, at first after ten times the time its answer was late by; once it is slow again
    /// (a third slow answer in a row, or a slow re-check), after at least two hundred times its
    /// method's usual time (a second where 5 ms is usual),
    /// then twice, four times... as long (at most 10 s) while it stays slow: a bounded number of
    /// calls per second whatever the rate, not a share of the traffic; its first fast answer
    /// counts it as one call again.
    #[default]
    FewestThenFastest,
    /// The instance with the fewest calls in flight; among those, equally fast instances take
    /// turns, and one that answers slower than the rest wins fewer of the ties, the fewer the
    /// slower it is, without ever being shut out (see the crate docs).
    LeastPending,
    /// The next instance in turn, ignoring load: a baseline for comparisons.
    RoundRobin,
    /// The less loaded of two distinct instances chosen at random (as tower's `p2c`).
    PowerOfTwoChoices,
    /// The lowest (calls in flight + 1) × peak-sensitive moving average of latency, as in
    /// Finagle and linkerd. The calls are this channel's own: calls in flight that instances
    /// report ([`orca`](crate::orca)) are not added, since the latency already carries the other
    /// clients' load.
    PeakEwma,
    /// Weighted round robin from the instances' load reports, as gRPC specifies it (gRFC
    /// A58): weights from the reported queries, errors and utilization, an
    /// earliest-deadline-first order; plain round robin until two instances have weights.
    /// Needs servers that report their load (see [`orca`](crate::orca)); set its settings with
    /// [`Builder::weighted_round_robin`](crate::Builder::weighted_round_robin).
    WeightedRoundRobin,
}

impl Strategy {
    /// The strategies by the names a service config gives them (the `tonic_balancer` policy's
    /// `strategy` field).
    #[cfg(feature = "service-config")]
    pub(crate) const NAMES: [(&'static str, Strategy); 6] = [
        ("fewest_then_fastest", Strategy::FewestThenFastest),
        ("least_pending", Strategy::LeastPending),
        ("round_robin", Strategy::RoundRobin),
        ("power_of_two_choices", Strategy::PowerOfTwoChoices),
        ("peak_ewma", Strategy::PeakEwma),
        ("weighted_round_robin", Strategy::WeightedRoundRobin),
    ];

    /// How long the tie-break gates an instance that answered markedly slower than the rest:
    /// the default waits for confirmation and gates for longer; the others (least pending's
    /// rule) gate at the first slow answer.
    pub(crate) fn gate_rule(self) -> crate::load::tie::GateRule {
        match self {
            Strategy::FewestThenFastest => crate::load::tie::GateRule::FEWEST_THEN_FASTEST,
            _ => crate::load::tie::GateRule::LEAST_PENDING,
        }
    }

    /// Whether the strategy keeps a schedule of weights from the instances' load reports,
    /// updated by a task of the channel (weighted round robin).
    pub(crate) fn keeps_weights(self) -> bool {
        self == Strategy::WeightedRoundRobin
    }
}

/// The strategy a channel picks with now: the builder's, or one a control plane chose for
/// it since (an xDS cluster's policy, see `xds::policy`). One byte, read once per pick with a
/// relaxed load (a plain load on x86 and ARM), so that changing it costs the pick nothing.
#[derive(Debug)]
pub(crate) struct Current(std::sync::atomic::AtomicU8);

impl Current {
    /// Every strategy, at its index in the cell.
    const ALL: [Strategy; 6] = [
        Strategy::FewestThenFastest,
        Strategy::LeastPending,
        Strategy::RoundRobin,
        Strategy::PowerOfTwoChoices,
        Strategy::PeakEwma,
        Strategy::WeightedRoundRobin,
    ];

    pub(crate) fn new(strategy: Strategy) -> Current {
        Current(std::sync::atomic::AtomicU8::new(Self::index(strategy)))
    }

    fn index(strategy: Strategy) -> u8 {
        Self::ALL
            .iter()
            .position(|s| *s == strategy)
            .expect("every strategy is in ALL") as u8
    }

    /// The strategy now.
    #[inline(always)]
    pub(crate) fn get(&self) -> Strategy {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Strategy::FewestThenFastest,
            1 => Strategy::LeastPending,
            2 => Strategy::RoundRobin,
            3 => Strategy::PowerOfTwoChoices,
            4 => Strategy::PeakEwma,
            _ => Strategy::WeightedRoundRobin,
        }
    }

    /// From now on, `strategy`.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set(&self, strategy: Strategy) {
        self.0
            .store(Self::index(strategy), std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every strategy goes in and comes out the same.
    #[test]
    fn the_cell_holds_every_strategy() {
        for s in Current::ALL {
            let cell = Current::new(Strategy::default());
            cell.set(s);
            assert_eq!(cell.get(), s);
            assert_eq!(Current::new(s).get(), s);
        }
    }
}
