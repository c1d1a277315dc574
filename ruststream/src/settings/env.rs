//! `RUSTSTREAM__…` variables as a settings source: `__` separates the
//! levels of a key, values read as TOML scalars (`8`, `true`, `"30s"`) —
//! except names (queue groups, dead-letter subjects, URLs), kept as written.
//! Figment's own `Env` reads only the process's environment; this one takes
//! the variables it is given, so a test passes its own.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::ENV_PREFIX;

/// Keys whose values are names, never numbers or booleans.
const TEXT_KEYS: &[&str] = &["queue_group", "dead_letter", "url"];

/// The name of this source in figment's metadata.
pub(super) const NAME: &str = "environment variables";

/// The variable that sets the key at `path`.
pub(super) fn var_name(path: &[&str]) -> String {
    let keys: Vec<String> = path.iter().map(|k| k.to_ascii_uppercase()).collect();
    format!("{ENV_PREFIX}{}", keys.join("__"))
}

/// The `RUSTSTREAM__` variables among those given.
pub(super) struct EnvVars(Vec<(Vec<String>, String)>);

impl EnvVars {
    pub(super) fn new(vars: impl Iterator<Item = (String, String)>) -> Self {
        EnvVars(
            vars.filter_map(|(name, value)| {
                let key = name.strip_prefix(ENV_PREFIX)?;
                let path = key.split("__").map(str::to_ascii_lowercase).collect();
                Some((path, value))
            })
            .collect(),
        )
    }
}

impl Provider for EnvVars {
    fn metadata(&self) -> Metadata {
        Metadata::named(NAME).interpolater(|_: &Profile, path: &[&str]| var_name(path))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for (path, value) in &self.0 {
            let value: Value = if path
                .last()
                .is_some_and(|key| TEXT_KEYS.contains(&key.as_str()))
            {
                // Kept as written: a queue group `007` is not the number 7.
                value.clone().into()
            } else {
                value.parse().expect("parsing a value is infallible")
            };
            insert(&mut dict, path, value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Puts `value` at `path` inside `dict`, making the levels on the way.
fn insert(dict: &mut Dict, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}
