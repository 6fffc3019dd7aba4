//! A value of the config with its JSON path, and the readers of the types a service config
//! uses (protobuf's JSON forms: durations as `"1.5s"`, status codes by name or number), so that
//! every refusal names what it refuses: `methodConfig[1].retryPolicy.maxAttempts: ...`.

use std::fmt::Display;
use std::time::Duration;

use serde_json::{Map, Value};
use tonic::Code;

use crate::error::Error;

/// What a field that is absent reads as, so that a missing field has a path too.
static ABSENT: Value = Value::Null;

/// The status codes by their names in gRPC's service config (`google.rpc.Code`'s).
const CODES: [(&str, Code); 17] = [
    ("OK", Code::Ok),
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

/// A value of the config, and where it is.
#[derive(Clone)]
pub(super) struct ConfigNode<'a> {
    value: &'a Value,
    /// `methodConfig[1].retryPolicy`; empty for the config itself.
    pub(super) path: String,
}

impl<'a> ConfigNode<'a> {
    /// The config itself.
    pub(super) fn root(value: &'a Value) -> ConfigNode<'a> {
        ConfigNode {
            value,
            path: String::new(),
        }
    }

    /// The refusal of this value: `path: why`, as the reason of an
    /// [`Error::InvalidSetting`] naming `service_config`.
    pub(super) fn refuse(&self, why: impl Display) -> Error {
        let reason = if self.path.is_empty() {
            why.to_string()
        } else {
            format!("{}: {why}", self.path)
        };
        Error::InvalidSetting {
            name: "service_config",
            reason,
        }
    }

    fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "an object",
        }
    }

    /// The refusal of a value of the wrong type.
    fn expected(&self, what: &str) -> Error {
        self.refuse(format_args!("must be {what}, not {}", self.kind()))
    }

    fn child(&self, key: &str, value: &'a Value) -> ConfigNode<'a> {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        ConfigNode { value, path }
    }

    /// The fields of an object.
    pub(super) fn object(&self) -> Result<&'a Map<String, Value>, Error> {
        self.value
            .as_object()
            .ok_or_else(|| self.expected("an object"))
    }

    /// Field `key` of this object, if it is there and not null (in protobuf's JSON, `null`
    /// is the same as absent). Its name as written, else in any case: grpc-go reads the keys
    /// so (Go's `encoding/json`), and its own examples write `"MaxAttempts"`.
    pub(super) fn field(&self, key: &str) -> Result<Option<ConfigNode<'a>>, Error> {
        let fields = self.object()?;
        let found = fields
            .get_key_value(key)
            .or_else(|| fields.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)));
        Ok(found
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| self.child(k, v)))
    }

    /// Field `key` of this object, which must be there.
    pub(super) fn required(&self, key: &str) -> Result<ConfigNode<'a>, Error> {
        self.field(key)?
            .ok_or_else(|| self.child(key, &ABSENT).refuse("required"))
    }

    /// The one field of an object that holds exactly one (a load-balancing config).
    pub(super) fn only_field(&self, example: &str) -> Result<(&'a str, ConfigNode<'a>), Error> {
        let fields = self.object()?;
        match fields.iter().next() {
            Some((key, value)) if fields.len() == 1 => Ok((key.as_str(), self.child(key, value))),
            _ => Err(self.refuse(format_args!(
                "must hold exactly one policy, as {example}, not {} fields",
                fields.len()
            ))),
        }
    }

    /// The items of a list.
    pub(super) fn items(&self) -> Result<Vec<ConfigNode<'a>>, Error> {
        let list = self
            .value
            .as_array()
            .ok_or_else(|| self.expected("a list"))?;
        Ok(list
            .iter()
            .enumerate()
            .map(|(i, value)| ConfigNode {
                value,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    pub(super) fn str(&self) -> Result<&'a str, Error> {
        self.value.as_str().ok_or_else(|| self.expected("a string"))
    }

    pub(super) fn bool(&self) -> Result<bool, Error> {
        self.value
            .as_bool()
            .ok_or_else(|| self.expected("true or false"))
    }

    /// A finite number.
    pub(super) fn number(&self) -> Result<f64, Error> {
        self.value
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.expected("a number"))
    }

    /// A whole number of at least 0 (`3`, or `3.0`).
    pub(super) fn whole(&self) -> Result<u64, Error> {
        if let Some(n) = self.value.as_u64() {
            return Ok(n);
        }
        match self.value.as_f64() {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 9.0e15 => Ok(x as u64),
            Some(x) => Err(self.refuse(format_args!(
                "must be a whole number of at least 0, not {x}"
            ))),
            None => Err(self.expected("a whole number")),
        }
    }

    /// A duration in protobuf's JSON form: seconds with up to nine decimals and an `s`
    /// (`"1.5s"`, `"0.000001s"`, `"30s"`); not negative.
    pub(super) fn duration(&self) -> Result<Duration, Error> {
        let s = self.str().map_err(|_| {
            self.refuse(format_args!(
                "must be a duration such as \"1.5s\", not {}",
                self.kind()
            ))
        })?;
        crate::time::parse_duration(s).map_err(|why| self.refuse(why))
    }

    /// A status code, by its name (`"UNAVAILABLE"`) or its number (`14`), as grpc-go and
    /// grpc-java read them.
    pub(super) fn code(&self) -> Result<Code, Error> {
        match self.value {
            Value::String(name) => CODES
                .iter()
                .find(|(n, _)| n == name)
                .map(|&(_, code)| code)
                .ok_or_else(|| {
                    let upper = name.to_ascii_uppercase();
                    match CODES.iter().find(|(n, _)| *n == upper) {
                        Some((n, _)) => self.refuse(format_args!(
                            "unknown status code {name:?}: the names are upper case ({n})"
                        )),
                        None => self.refuse(format_args!(
                            "unknown status code {name:?} (a name such as \"UNAVAILABLE\", or its \
                             number, 0 to 16)"
                        )),
                    }
                }),
            Value::Number(_) => match self.whole() {
                Ok(n) if n <= 16 => Ok(Code::from_i32(n as i32)),
                _ => Err(self.refuse(format_args!(
                    "unknown status code {}: the numbers are 0 to 16",
                    self.value
                ))),
            },
            _ => Err(self.expected("a status code, by name (\"UNAVAILABLE\") or number")),
        }
    }

    /// A list of status codes, none of them OK.
    pub(super) fn codes(&self) -> Result<Vec<Code>, Error> {
        let mut codes = Vec::new();
        for item in self.items()? {
            let code = item.code()?;
            if code == Code::Ok {
                return Err(item.refuse("OK is not a failure"));
            }
            if !codes.contains(&code) {
                codes.push(code);
            }
        }
        Ok(codes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_by_name_or_number() {
        let read = |json: &str| {
            let v: Value = serde_json::from_str(json).unwrap();
            ConfigNode::root(&v).code().map_err(|e| e.to_string())
        };
        assert_eq!(read("\"UNAVAILABLE\""), Ok(Code::Unavailable));
        assert_eq!(read("14"), Ok(Code::Unavailable));
        assert_eq!(read("14.0"), Ok(Code::Unavailable));
        assert_eq!(read("\"CANCELLED\""), Ok(Code::Cancelled));
        assert_eq!(read("16"), Ok(Code::Unauthenticated));
        assert!(read("\"unavailable\"")
            .unwrap_err()
            .contains("upper case (UNAVAILABLE)"));
        assert!(read("\"Unavailable\"").is_err());
        assert!(read("17").unwrap_err().contains("0 to 16"));
        assert!(read("-1").is_err());
        assert!(read("1.5").is_err());
        assert!(read("true").is_err());
    }

    #[test]
    fn paths_name_fields_and_items() {
        let v: Value = serde_json::from_str(r#"{"a": [{"b": 1}, {"c": null}]}"#).unwrap();
        let root = ConfigNode::root(&v);
        let items = root.required("a").unwrap().items().unwrap();
        let err = items[0].required("b").unwrap().str().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid setting `service_config`: a[0].b: must be a string, not a number"
        );
        assert!(items[1].field("c").unwrap().is_none(), "null is absent");
        let Err(err) = items[1].required("c") else {
            panic!("a null field is absent")
        };
        assert!(err.to_string().ends_with("a[1].c: required"), "{err}");
        assert!(root
            .str()
            .unwrap_err()
            .to_string()
            .ends_with(": must be a string, not an object"));
    }
}
