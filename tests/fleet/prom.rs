//! The Prometheus text format as the tests read it: one sample line at a time.

use std::collections::BTreeMap;

/// A sample line's (name, labels, value); `None` for a comment or an empty line. Label values
/// the tests look at hold no `",` (a URI, a method, a status, a state).
pub fn sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (head, value) = line.rsplit_once(' ').expect("a sample line");
    let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, rest.trim_end_matches('}')),
        None => (head, ""),
    };
    let labels = labels
        .split("\",")
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("label=value");
            (k.to_owned(), v.trim_matches('"').to_owned())
        })
        .collect();
    Some((name.to_owned(), labels, value))
}
