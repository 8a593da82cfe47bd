//! `mooncake.store.ReplicateConfig`: how many replicas a put makes and where.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{Flag, Unsigned};
use crate::enums::{ObjectDataType, SoftPinAction};

/// Replication settings for a put. Fields mirror the reference's class
/// (including the newer `soft_pin_action`/`data_type`/... fields, which are
/// stored and shown but only the first ones change placement); the older
/// `with_soft_pin` flag is kept as a view of `soft_pin_action`.
/// `group_ids` names each key's object group (see `types::ReplicaPolicy`).
#[pyclass(module = "mooncake.store", name = "ReplicateConfig")]
#[derive(Clone, Debug)]
pub(crate) struct ReplicateConfig {
    #[pyo3(get)]
    pub(crate) replica_num: u64,
    #[pyo3(get)]
    pub(crate) nof_replica_num: u64,
    #[pyo3(get)]
    pub(crate) dfs_replica_num: u64,
    #[pyo3(get, set)]
    pub(crate) soft_pin_action: SoftPinAction,
    #[pyo3(get)]
    pub(crate) soft_pin_ttl_ms: Option<u64>,
    #[pyo3(get)]
    pub(crate) with_hard_pin: bool,
    #[pyo3(get)]
    pub(crate) preferred_segment: String,
    #[pyo3(get)]
    pub(crate) preferred_segments: Vec<String>,
    #[pyo3(get)]
    pub(crate) preferred_nof_segments: Vec<String>,
    #[pyo3(get)]
    pub(crate) prefer_alloc_in_same_node: bool,
    #[pyo3(get, set)]
    pub(crate) data_type: ObjectDataType,
    #[pyo3(get)]
    pub(crate) group_ids: Option<Vec<String>>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: SoftPinAction::PRESERVE,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
            preferred_nof_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
            data_type: ObjectDataType::UNKNOWN,
            group_ids: None,
        }
    }
}

/// A list of strings; a bare `str` is a `TypeError` (not a list of characters).
fn strings(ob: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    ob.extract::<Vec<String>>()
        .map_err(|_| PyTypeError::new_err("incompatible function arguments: expected list[str]"))
}

#[pymethods]
impl ReplicateConfig {
    /// `ReplicateConfig()`; fields may also be given as keywords.
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Some(kwargs) = kwargs else {
            return Ok(ReplicateConfig::default());
        };
        let obj = Bound::new(py, ReplicateConfig::default())?;
        for (k, v) in kwargs.iter() {
            let name: String = k.extract()?;
            if !FIELDS.contains(&name.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "ReplicateConfig() got an unexpected keyword argument '{name}'"
                )));
            }
            obj.setattr(name.as_str(), v)?;
        }
        let cfg = obj.borrow().clone();
        Ok(cfg)
    }

    #[setter]
    fn set_replica_num(&mut self, v: Unsigned) {
        self.replica_num = v.0;
    }

    #[setter]
    fn set_nof_replica_num(&mut self, v: Unsigned) {
        self.nof_replica_num = v.0;
    }

    #[setter]
    fn set_dfs_replica_num(&mut self, v: Unsigned) {
        self.dfs_replica_num = v.0;
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, v: Option<Unsigned>) {
        self.soft_pin_ttl_ms = v.map(|u| u.0);
    }

    #[setter]
    fn set_with_hard_pin(&mut self, v: Flag) {
        self.with_hard_pin = v.0;
    }

    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, v: Flag) {
        self.prefer_alloc_in_same_node = v.0;
    }

    #[setter]
    fn set_preferred_segment(&mut self, v: String) {
        self.preferred_segment = v;
    }

    #[setter]
    fn set_preferred_segments(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.preferred_segments = strings(v)?;
        Ok(())
    }

    #[setter]
    fn set_preferred_nof_segments(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.preferred_nof_segments = strings(v)?;
        Ok(())
    }

    #[setter]
    fn set_group_ids(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.group_ids = if v.is_none() { None } else { Some(strings(v)?) };
        Ok(())
    }

    /// Whether puts soft-pin the object (`soft_pin_action == ENABLE`).
    #[getter]
    fn get_with_soft_pin(&self) -> bool {
        self.soft_pin_action == SoftPinAction::ENABLE
    }

    #[setter]
    fn set_with_soft_pin(&mut self, v: Flag) {
        self.soft_pin_action = if v.0 {
            SoftPinAction::ENABLE
        } else {
            SoftPinAction::PRESERVE
        };
    }

    fn __str__(&self) -> String {
        self.to_string()
    }

    fn __repr__(&self) -> String {
        self.to_string()
    }
}

const FIELDS: &[&str] = &[
    "replica_num",
    "nof_replica_num",
    "dfs_replica_num",
    "soft_pin_action",
    "soft_pin_ttl_ms",
    "with_hard_pin",
    "with_soft_pin",
    "preferred_segment",
    "preferred_segments",
    "preferred_nof_segments",
    "prefer_alloc_in_same_node",
    "data_type",
    "group_ids",
];

impl std::fmt::Display for ReplicateConfig {
    /// The reference's layout, field for field.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ttl = self
            .soft_pin_ttl_ms
            .map_or_else(|| "default".to_owned(), |t| t.to_string());
        write!(
            f,
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, \
             soft_pin_action: {}, soft_pin_ttl_ms: {ttl}, with_hard_pin: {}, preferred_segments: [{}], ",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action.name(),
            self.with_hard_pin as u8,
            self.preferred_segments.join(", "),
        )?;
        if !self.preferred_segment.is_empty() {
            write!(
                f,
                "preferred_segment (deprecated): {}, ",
                self.preferred_segment
            )?;
        }
        write!(
            f,
            "preferred_nof_segments: [{}], prefer_alloc_in_same_node: {}, data_type: {}",
            self.preferred_nof_segments.join(", "),
            self.prefer_alloc_in_same_node as u8,
            self.data_type.name(),
        )?;
        if let Some(groups) = &self.group_ids {
            write!(f, ", group_ids: [{}]", groups.join(", "))?;
        }
        write!(f, " }}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_string_matches_the_reference() {
        assert_eq!(
            ReplicateConfig::default().to_string(),
            "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, soft_pin_action: PRESERVE, \
             soft_pin_ttl_ms: default, with_hard_pin: 0, preferred_segments: [], preferred_nof_segments: [], \
             prefer_alloc_in_same_node: 0, data_type: UNKNOWN }"
        );
    }

    #[test]
    fn full_string_matches_the_reference() {
        let cfg = ReplicateConfig {
            replica_num: 3,
            soft_pin_action: SoftPinAction::ENABLE,
            soft_pin_ttl_ms: Some(5),
            with_hard_pin: true,
            preferred_segments: vec!["a".into(), "b".into()],
            preferred_segment: "x".into(),
            preferred_nof_segments: vec!["n".into()],
            prefer_alloc_in_same_node: true,
            data_type: ObjectDataType::KVCACHE,
            ..Default::default()
        };
        assert_eq!(
            cfg.to_string(),
            "ReplicateConfig: { replica_num: 3, nof_replica_num: 0, dfs_replica_num: 0, soft_pin_action: ENABLE, \
             soft_pin_ttl_ms: 5, with_hard_pin: 1, preferred_segments: [a, b], preferred_segment (deprecated): x, \
             preferred_nof_segments: [n], prefer_alloc_in_same_node: 1, data_type: KVCACHE }"
        );
    }

    #[test]
    fn groups_are_shown_when_set() {
        let cfg = ReplicateConfig {
            group_ids: Some(vec!["g".into(), String::new()]),
            ..Default::default()
        };
        assert!(cfg
            .to_string()
            .ends_with("data_type: UNKNOWN, group_ids: [g, ] }"));
    }
}
