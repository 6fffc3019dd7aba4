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

/// The labels of a sample.
pub type Labels = BTreeMap<String, String>;

/// One scrape: its text, every sample line as (name, labels, value), and the `# TYPE` of each
/// family.
pub struct Scrape {
    pub text: String,
    samples: Vec<(String, Labels, f64)>,
    kinds: BTreeMap<String, String>,
}

impl Scrape {
    pub fn parse(text: String) -> Scrape {
        let mut samples = Vec::new();
        let mut kinds = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (family, kind) = rest.split_once(' ').expect("# TYPE family kind");
                kinds.insert(family.to_owned(), kind.to_owned());
                continue;
            }
            samples.extend(sample(line));
        }
        Scrape {
            text,
            samples,
            kinds,
        }
    }

    /// The samples of `name` whose labels include all of `with`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        with: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = (&'a Labels, f64)> + 'a {
        self.samples
            .iter()
            .filter(move |(n, labels, _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, l, v)| (l, *v))
    }

    /// The sum of the samples of `name` whose labels include all of `with`.
    pub fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.matching(name, with).map(|(_, v)| v).sum()
    }

    /// The `# TYPE` of a family.
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.kinds.get(family).map(String::as_str)
    }
}
