//! The fields of `tracing` events and spans as text, for tests that check what the channel
//! logs (a `tracing_subscriber::Layer` of the test's own records them with [`Collect`]).

use std::collections::HashMap;

use tracing::field::{Field, Visit};

/// An event's or a span's fields: name to value, as text.
pub type Fields = HashMap<String, String>;

/// Records each field it visits into its map.
pub struct Collect<'a>(pub &'a mut Fields);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}
