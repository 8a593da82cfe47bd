//! `get_local_topology`: the NUMA nodes of this machine in the reference's
//! JSON layout.

use pyo3::prelude::*;

use super::PyEngine;

#[pymethods]
impl PyEngine {
    /// The local topology as JSON: each NUMA node `cpu:N` with its preferred
    /// and available NICs (none are used by the tcp transport).
    #[pyo3(signature = (device_name = None))]
    fn get_local_topology(&self, device_name: Option<&str>) -> String {
        let _ = device_name;
        topology_json(numa_nodes())
    }
}

fn numa_nodes() -> Vec<u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|dir| {
            dir.filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix("node")?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The reference's topology JSON (jsoncpp's styled layout) for `nodes`
/// without NICs.
fn topology_json(nodes: Vec<u32>) -> String {
    let entries: Vec<String> = nodes
        .iter()
        .map(|n| format!("\t\"cpu:{n}\" : \n\t[\n\t\t[],\n\t\t[]\n\t]"))
        .collect();
    format!("{{\n{}\n}}\n", entries.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_matches_the_reference_layout() {
        assert_eq!(
            topology_json(vec![0]),
            "{\n\t\"cpu:0\" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n"
        );
        let two = topology_json(vec![0, 1]);
        assert!(two.contains("\t],\n\t\"cpu:1\""));
        assert_eq!(two.matches('[').count(), two.matches(']').count());
        assert_eq!(two.matches('{').count(), two.matches('}').count());
    }
}
