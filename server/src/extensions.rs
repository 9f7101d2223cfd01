//! The extensions' status: an extension of the node may give a [`StatusTable`]; the main and read-only
//! ports serve the started extensions' [`StatusTables`] as `meta.k8s.io/v1` `Table`s on `/extensions/{name}`,
//! which `nodelet get {name}` prints like the other `get` tables.

use std::sync::Arc;

/// An extension's status as a table: column names and rows of cells, read on every request.
pub trait StatusTable: Send + Sync + 'static {
    /// The column headers (`NAME`, `STATUS`, …); `nodelet get` prints them as given.
    fn columns(&self) -> Vec<String>;
    /// One row per object, as many cells as [`columns`](Self::columns), the object's name first.
    fn rows(&self) -> Vec<Vec<String>>;
}

/// The started extensions' status tables, by name: what the servers serve on `/extensions/{name}`.
#[derive(Clone, Default)]
pub struct StatusTables(std::collections::BTreeMap<String, Arc<dyn StatusTable>>);

impl std::fmt::Debug for StatusTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

impl StatusTables {
    /// Adds (or replaces) the table of the extension `name`.
    pub fn insert(&mut self, name: String, table: Arc<dyn StatusTable>) {
        self.0.insert(name, table);
    }

    /// Whether no extension has a table.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The table as a `meta.k8s.io/v1` `Table` (what kubectl's server-side printing reads): one string
    /// column per header, one row per object with its cells; `None` for an unknown name.
    pub(crate) fn table(&self, name: &str) -> Option<serde_json::Value> {
        let table = self.0.get(name)?;
        let columns: Vec<serde_json::Value> = table
            .columns()
            .into_iter()
            .map(|c| serde_json::json!({"name": c, "type": "string", "format": "", "description": "", "priority": 0}))
            .collect();
        let rows: Vec<serde_json::Value> =
            table.rows().into_iter().map(|cells| serde_json::json!({"cells": cells})).collect();
        Some(serde_json::json!({
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {},
            "columnDefinitions": columns,
            "rows": rows,
        }))
    }
}
