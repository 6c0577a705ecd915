//! The parameter grid: which profile keys a sweep varies, over which
//! values, and the engine configuration of every point.

use std::fmt;

use pinpoll::EngineConfig;

use crate::profile;

/// Profile keys a grid may vary.
pub const KEYS: &[&str] = &[
    "batch_size",
    "signal_interval",
    "inline_threshold",
    "send_queue_depth",
    "recv_queue_depth",
    "cq_depth",
    "slot_size",
    "slot_count",
    "idle",
    "backoff_spins",
    "hugepages",
];

/// Keys whose values are words, not numbers.
const WORD_KEYS: &[&str] = &["idle", "hugepages"];

/// One value of a parameter: a number, or a word (`idle = "spin"`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Int(u64),
    Word(String),
}

impl Value {
    /// The value as a TOML literal.
    pub fn toml(&self) -> String {
        match self {
            Value::Int(n) => n.to_string(),
            Value::Word(w) => format!("{w:?}"),
        }
    }

    fn to_toml_value(&self) -> toml::Value {
        match self {
            Value::Int(n) => toml::Value::Integer(*n as i64),
            Value::Word(w) => toml::Value::String(w.clone()),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Word(w) => f.write_str(w),
        }
    }
}

/// The keys a sweep varies, each with its values, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Grid {
    pub axes: Vec<(String, Vec<Value>)>,
}

fn parse_value(key: &str, text: &str) -> Result<Value, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("{key}: an empty value"));
    }
    if WORD_KEYS.contains(&key) {
        let word = text.trim_matches('"');
        return Ok(Value::Word(word.to_owned()));
    }
    text.parse::<u64>()
        .map(Value::Int)
        .map_err(|_| format!("{key}={text}: not a whole number"))
}

fn check_key(key: &str) -> Result<(), String> {
    if KEYS.contains(&key) {
        Ok(())
    } else {
        Err(format!(
            "{key:?} cannot be swept: give one of {}",
            KEYS.join(", ")
        ))
    }
}

impl Grid {
    /// The default grid: small enough for a few minutes on rxe under TCG.
    pub fn default_grid() -> Grid {
        Grid {
            axes: vec![
                ("batch_size".into(), vec![Value::Int(1), Value::Int(16)]),
                (
                    "signal_interval".into(),
                    vec![Value::Int(1), Value::Int(16)],
                ),
            ],
        }
    }

    fn add(&mut self, key: &str, values: Vec<Value>) -> Result<(), String> {
        check_key(key)?;
        if self.axes.iter().any(|(k, _)| k == key) {
            return Err(format!("{key} is given twice"));
        }
        let mut unique: Vec<Value> = Vec::new();
        for v in values {
            if !unique.contains(&v) {
                unique.push(v);
            }
        }
        if unique.is_empty() {
            return Err(format!("{key}: no values"));
        }
        self.axes.push((key.to_owned(), unique));
        Ok(())
    }

    /// Parses `KEY=V1,V2,...` arguments (`batch_size=1,16 idle=spin,backoff`).
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Grid, String> {
        let mut grid = Grid::default();
        for arg in args {
            let arg = arg.as_ref();
            let (key, values) = arg
                .split_once('=')
                .ok_or_else(|| format!("{arg:?}: give KEY=V1,V2,... (e.g. batch_size=1,16)"))?;
            let key = key.trim();
            check_key(key)?;
            let values = values
                .split(',')
                .map(|v| parse_value(key, v))
                .collect::<Result<Vec<_>, _>>()?;
            grid.add(key, values)?;
        }
        Ok(grid)
    }

    /// Parses a grid file: one key per line, a value or an array of values
    /// (`batch_size = [1, 16]`, `idle = ["spin", "backoff"]`).
    pub fn from_toml(text: &str) -> Result<Grid, String> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| e.message().to_owned())?;
        let mut grid = Grid::default();
        for (key, value) in &table {
            check_key(key)?;
            let items = match value {
                toml::Value::Array(a) => a.clone(),
                other => vec![other.clone()],
            };
            let values = items
                .iter()
                .map(|item| match item {
                    toml::Value::Integer(n) if *n >= 0 => parse_value(key, &n.to_string()),
                    toml::Value::String(s) => parse_value(key, s),
                    other => Err(format!("{key}: {other} is not a value of {key}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            grid.add(key, values)?;
        }
        Ok(grid)
    }

    /// Adds the axes of `other` (an error if a key is in both).
    pub fn merge(&mut self, other: Grid) -> Result<(), String> {
        for (k, v) in other.axes {
            self.add(&k, v)?;
        }
        Ok(())
    }

    pub fn keys(&self) -> Vec<&str> {
        self.axes.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// Every combination, the last key varying fastest. An empty grid has
    /// one point: the base profile itself.
    pub fn points(&self) -> Vec<Point> {
        let mut combos: Vec<Vec<(String, Value)>> = vec![Vec::new()];
        for (key, values) in &self.axes {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut next = c.clone();
                        next.push((key.clone(), v.clone()));
                        next
                    })
                })
                .collect();
        }
        combos
            .into_iter()
            .enumerate()
            .map(|(index, settings)| Point { index, settings })
            .collect()
    }
}

/// One combination of the grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Position in [`Grid::points`], from 0.
    pub index: usize,
    pub settings: Vec<(String, Value)>,
}

impl Point {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.settings.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `batch_size=1 signal_interval=16` (`base` for the empty point).
    pub fn label(&self) -> String {
        if self.settings.is_empty() {
            return "base".into();
        }
        self.settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The configuration of `point` on top of `base`, as a profile table
/// (every key, so the file stands alone) and validated by the engine.
///
/// `cq_depth` is derived unless the grid sets it: raised to
/// max(send_queue_depth, recv_queue_depth) when a deeper queue needs it.
/// A device limit on inline data (`max_inline`) is checked here too, so
/// a point the device would refuse is skipped before it runs.
pub fn point_config(
    base: &EngineConfig,
    point: &Point,
    max_inline: Option<u32>,
) -> Result<(toml::Table, EngineConfig), String> {
    let text: String = profile::effective_keys(base)
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect();
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("the base profile: {}", e.message()))?;
    for (key, value) in &point.settings {
        table.insert(key.clone(), value.to_toml_value());
    }
    if point.get("idle") == Some(&Value::Word("spin".into()))
        && point.get("backoff_spins").is_none()
    {
        table.remove("backoff_spins");
    }
    if point.get("cq_depth").is_none() {
        let get = |k: &str| table.get(k).and_then(toml::Value::as_integer).unwrap_or(0);
        let need = get("send_queue_depth").max(get("recv_queue_depth"));
        if get("cq_depth") < need {
            table.insert("cq_depth".into(), toml::Value::Integer(need));
        }
    }
    let text = toml::to_string(&table).map_err(|e| e.to_string())?;
    let config = EngineConfig::from_toml(&text).map_err(|e| profile::load_error(&e))?;
    if let Some(max) = max_inline {
        if config.inline_threshold > max {
            return Err(format!(
                "inline_threshold = {} is out of range: the device inlines at most {max} bytes (max_inline_data)",
                config.inline_threshold
            ));
        }
    }
    Ok((table, config))
}
