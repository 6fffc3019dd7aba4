//! A build that opens a connection to each instance first, as tonic's `Endpoint::connect`
//! does for one.

use super::Builder;
use crate::error::Error;
use crate::BalancedChannel;

impl Builder {
    /// Builds the channel and opens a connection to each of its instances now, as tonic's
    /// `Endpoint::connect` does for one: returns once they have all answered or failed, with
    /// the connected ones ready and the others reconnecting in the background
    /// ([`Backoff`](crate::Backoff)).
    /// Fails if none could be reached, naming each instance and why. Each attempt is bounded
    /// by the endpoint's `connect_timeout` (5 s with [`uri`](Builder::uri)) and by
    /// [`Backoff::min_connect_timeout`](crate::Backoff::min_connect_timeout). With discovery,
    /// waits for the source's first answer
    /// instead (the instances it names connect on their first calls).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uri("http://10.0.0.7:50051")
    ///     .uri("http://10.0.0.8:50051")
    ///     .connect()
    ///     .await?; // Err if neither answers
    /// # let _ = channel; Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<BalancedChannel, Error> {
        let bound = self.backoff.min_connect_timeout;
        let mut attempts = tokio::task::JoinSet::new();
        // With subsetting, the instances of the subset only (bad settings: build() says so).
        let eager = match crate::set::subset::Aperture::new(self.subset, self.subset_client) {
            Ok(Some(s)) => s.choose(&self.endpoints),
            _ => self.endpoints.iter().collect(),
        };
        let statics = eager.len();
        for target in eager {
            let attempt = target.connect();
            let (key, name) = (target.key.clone(), target.name.clone());
            attempts.spawn(async move {
                let result = match tokio::time::timeout(bound, attempt).await {
                    Ok(Ok(channel)) => Ok(channel),
                    Ok(Err(e)) => Err(crate::error::chain(&e)),
                    Err(_) => Err(format!("no connection within {bound:?}")),
                };
                (key, name, result)
            });
        }
        let mut connected = std::collections::HashMap::new();
        let mut failed = Vec::new();
        while let Some(done) = attempts.join_next().await {
            match done {
                Ok((key, _, Ok(channel))) => {
                    connected.insert(key, channel);
                }
                Ok((key, name, Err(why))) => failed.push((Some(key), name, why)),
                Err(e) => failed.push((None, "".into(), e.to_string())),
            }
        }
        let discovery = self.discovery.is_some();
        let channel = self.build_with(connected)?;
        let pool = &channel.shared;
        for (key, _, why) in &failed {
            let key = key.as_ref();
            if let Some(inst) = pool.snapshot().iter().find(|i| Some(&i.target.key) == key) {
                inst.ctx
                    .events
                    .connect_failed(inst, &crate::error::Message(why.clone()));
            }
        }
        if discovery {
            let mut rx = pool.set().discovered.subscribe();
            let _ = rx.wait_for(|done| *done).await;
            if pool.snapshot().is_empty() {
                let why = pool.set().discovery_error().unwrap_or_default();
                return Err(Error::NoUsableInstance {
                    reason: format!("tonic-balancer: discovery found no instance: {why}"),
                });
            }
        } else if statics > 0 && failed.len() == statics {
            let each: Vec<String> = failed
                .iter()
                .map(|(_, name, why)| format!("{name}: {why}"))
                .collect();
            return Err(Error::NoUsableInstance {
                reason: format!(
                    "tonic-balancer: {} ({})",
                    match statics {
                        1 => "the one instance could not be reached".to_owned(),
                        n => format!("none of the {n} instances could be reached"),
                    },
                    each.join("; ")
                ),
            });
        }
        Ok(channel)
    }
}
