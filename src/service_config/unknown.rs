//! The fields of a service config that the channel does not read. gRPC ignores unknown fields,
//! so that an old client takes a newer config, and so does the channel; but a misspelt key
//! (`"methodConfigs"`) would leave a config empty without a word, so each one is named: its
//! JSON path, and the known key it resembles. Known gRPC fields the channel does not use are
//! named too. Fields of a `loadBalancingConfig` entry are the policy's own and checked there.
//!
//! Source: [service_config.proto](https://github.com/grpc/grpc-proto/blob/master/grpc/service_config/service_config.proto).

use serde_json::Value;

/// What the channel reads of an object, field by field.
enum Schema {
    /// An object: its known fields and what each holds.
    Object(&'static [(&'static str, Schema)]),
    /// A list of what it holds.
    List(&'static Schema),
    /// A value read whole (a number, a string, a duration, a list of codes), or a field whose
    /// contents are checked elsewhere (a load-balancing config).
    Leaf,
    /// A gRPC field the channel does not use.
    Unused(&'static str),
}

use Schema::{Leaf, List, Object, Unused};

const NAME: Schema = Object(&[("service", Leaf), ("method", Leaf)]);

const RETRY: Schema = Object(&[
    ("maxAttempts", Leaf),
    ("initialBackoff", Leaf),
    ("maxBackoff", Leaf),
    ("backoffMultiplier", Leaf),
    ("retryableStatusCodes", Leaf),
    (
        "perAttemptRecvTimeout",
        Unused("each attempt has the call's deadline; a per-attempt timeout is not supported"),
    ),
]);

const HEDGING: Schema = Object(&[
    ("maxAttempts", Leaf),
    ("hedgingDelay", Leaf),
    ("nonFatalStatusCodes", Leaf),
]);

const METHOD_CONFIG: Schema = Object(&[
    ("name", List(&NAME)),
    ("waitForReady", Leaf),
    ("timeout", Leaf),
    ("maxRequestMessageBytes", Leaf),
    ("maxResponseMessageBytes", Leaf),
    ("retryPolicy", RETRY),
    ("hedgingPolicy", HEDGING),
]);

#[cfg(feature = "health-check")]
const HEALTH_CHECK: Schema = Object(&[("serviceName", Leaf)]);
/// Without the feature, grpc-go likewise ignores it (with an error in its log) when its health
/// package is not linked in.
#[cfg(not(feature = "health-check"))]
const HEALTH_CHECK: Schema = Unused("health checks need the feature `health-check`");

const ROOT: Schema = Object(&[
    ("methodConfig", List(&METHOD_CONFIG)),
    (
        "retryThrottling",
        Object(&[("maxTokens", Leaf), ("tokenRatio", Leaf)]),
    ),
    ("loadBalancingConfig", Leaf),
    ("loadBalancingPolicy", Leaf),
    ("healthCheckConfig", HEALTH_CHECK),
    (
        "connectionScaling",
        Object(&[("maxConnectionsPerSubchannel", Leaf)]),
    ),
]);

/// Every field of `config` the channel does not read, each as `path: why` (a config that is
/// not an object has none: reading it refused it already).
pub(super) fn fields(config: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(config, &ROOT, "", &mut out);
    // In the order of the paths, whatever order the JSON map keeps.
    out.sort();
    out
}

fn walk(value: &Value, schema: &Schema, path: &str, out: &mut Vec<String>) {
    match (schema, value) {
        (Object(known), Value::Object(fields)) => {
            for (key, v) in fields {
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                // Keys are matched in any case, as the reader matches them.
                match known.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)) {
                    Some((_, Unused(why))) => out.push(format!("{here}: not used ({why})")),
                    Some((_, inner)) => walk(v, inner, &here, out),
                    None => out.push(match resembles(key, known) {
                        Some(k) => format!("{here}: unknown field, ignored (did you mean {k:?}?)"),
                        None => format!("{here}: unknown field, ignored"),
                    }),
                }
            }
        }
        (List(item), Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, item, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The known key `key` is likely a misspelling of: at most two edits away (a letter missing,
/// added, changed), in any case.
fn resembles(key: &str, known: &[(&'static str, Schema)]) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    known
        .iter()
        .map(|(k, _)| (*k, edits(&key, &k.to_ascii_lowercase())))
        .filter(|(_, d)| *d <= 2)
        .min_by_key(|(_, d)| *d)
        .map(|(k, _)| k)
}

/// Levenshtein's distance between two short keys.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(json: &str) -> Vec<String> {
        fields(&serde_json::from_str(json).unwrap())
    }

    #[test]
    fn misspelt_and_unknown_keys_are_named_with_their_path() {
        assert_eq!(
            of(r#"{"methodConfigs": [{"name": [{"service": "a.B"}]}]}"#),
            ["methodConfigs: unknown field, ignored (did you mean \"methodConfig\"?)"]
        );
        assert_eq!(
            of(r#"{"methodConfig": [{"name": [{"servce": "a.B"}],
                  "retryPolicy": {"MaxAttempts": 2, "perAttemptRecvTimeout": "1s",
                                  "jitter": 0.2}}],
                  "x-team": "payments"}"#),
            [
                "methodConfig[0].name[0].servce: unknown field, ignored (did you mean \"service\"?)",
                "methodConfig[0].retryPolicy.jitter: unknown field, ignored",
                "methodConfig[0].retryPolicy.perAttemptRecvTimeout: not used (each attempt has \
                 the call's deadline; a per-attempt timeout is not supported)",
                "x-team: unknown field, ignored",
            ]
        );
    }

    /// A config of fields the channel reads has none to say; without the `health-check`
    /// feature, its `healthCheckConfig` is one, and says which feature reads it.
    #[test]
    fn a_config_of_known_fields_has_none() {
        let fields = of(r#"{"methodConfig": [{"name": [{}], "timeout": "1s",
            "hedgingPolicy": {"maxAttempts": 2}}],
            "loadBalancingConfig": [{"round_robin": {"anything": 1}}],
            "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
            "healthCheckConfig": {"serviceName": ""}}"#);
        if cfg!(feature = "health-check") {
            assert!(fields.is_empty(), "{fields:?}");
        } else {
            assert_eq!(fields.len(), 1, "{fields:?}");
            assert!(fields[0].starts_with("healthCheckConfig"), "{fields:?}");
            assert!(fields[0].contains("`health-check`"), "{fields:?}");
        }
    }
}
