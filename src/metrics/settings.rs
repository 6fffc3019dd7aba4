//! What a builder sets of a channel's metrics, checked when it is built.

/// The metrics settings of a [`Builder`](crate::Builder).
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSettings {
    pub(crate) target: Option<String>,
    /// Methods (and services) pinned by `metrics_methods`: only these are labelled.
    pub(crate) methods: Vec<String>,
    pub(crate) all_methods: bool,
    /// The instance label on the per-instance instruments (off: per target).
    pub(crate) per_instance: bool,
}

impl LabelSettings {
    /// Refuses a malformed method name, naming it.
    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        for m in &self.methods {
            let name = m.strip_prefix('/').unwrap_or(m);
            let ok = !name.is_empty()
                && name.split('/').count() <= 2
                && name.split('/').all(|part| {
                    !part.is_empty() && !part.chars().any(|c| c.is_whitespace() || c == '?')
                });
            if !ok {
                return Err(crate::Error::InvalidSetting {
                    name: "metrics_methods",
                    reason: format!("{m:?} is not `pkg.Service/Method` nor `pkg.Service`"),
                });
            }
        }
        if self.target.as_deref() == Some("") {
            return Err(crate::Error::InvalidSetting {
                name: "metrics_target",
                reason: "must not be empty".to_owned(),
            });
        }
        Ok(())
    }
}
