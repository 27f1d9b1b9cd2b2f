//! `KVCacheBlocks` and the block views behind its `blocks` attribute, as
//! native classes: the result of every `allocate_slots` and its
//! `get_block_ids()` cost one native call each, not a Python frame.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use smallvec::SmallVec;

/// vLLM's `KVCacheBlock` fields as a live, read-only view of one block.
#[pyclass(module = "hybridcache._native", name = "BlockView", frozen, eq, hash)]
pub struct BlockView {
    owner: PyObject,
    #[pyo3(get)]
    block_id: i64,
}

impl PartialEq for BlockView {
    fn eq(&self, other: &Self) -> bool {
        self.owner.is(&other.owner) && self.block_id == other.block_id
    }
}

impl std::hash::Hash for BlockView {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.block_id.hash(state);
    }
}

impl BlockView {
    fn free_link(&self, py: Python<'_>, forward: bool) -> PyResult<PyObject> {
        let queue = self
            .owner
            .bind(py)
            .getattr("block_pool")?
            .getattr("free_block_queue")?;
        Ok(queue
            .call_method1("_free_link", (self.block_id, forward))?
            .unbind())
    }
}

#[pymethods]
impl BlockView {
    /// Its manager, for the garbage collector: the pool view a manager
    /// keeps (`block_pool.null_block`) is a BlockView, a reference cycle.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.owner)
    }

    #[new]
    fn new(native: PyObject, block_id: i64) -> Self {
        BlockView {
            owner: native,
            block_id,
        }
    }

    #[getter]
    fn ref_cnt(&self, py: Python<'_>) -> PyResult<PyObject> {
        self.owner.call_method1(py, "ref_cnt", (self.block_id,))
    }

    /// vLLM's `BlockHashWithGroupId`: hash bytes + 4-byte big-endian group.
    #[getter]
    fn block_hash<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let h = self
            .owner
            .call_method1(py, "block_hash", (self.block_id,))?;
        let Some((hash, group)) = h.extract::<Option<(Vec<u8>, u32)>>(py)? else {
            return Ok(None);
        };
        let mut key = hash;
        key.extend_from_slice(&group.to_be_bytes());
        Ok(Some(PyBytes::new(py, &key)))
    }

    /// vLLM's `block_hash_num_tokens`: prefix tokens the block's
    /// hash covers, None without one.
    #[getter]
    fn block_hash_num_tokens(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        let n = self
            .owner
            .call_method1(py, "block_hash_num_tokens", (vec![self.block_id],))?;
        Ok(n.extract::<Vec<Option<u32>>>(py)?
            .into_iter()
            .next()
            .flatten())
    }

    /// vLLM's free-list links: the next / previous block in the free queue
    /// (the queue's fake head / tail at its ends), or None if not free.
    /// Served by `block_pool.free_block_queue` of the owning manager.
    #[getter]
    fn next_free_block(&self, py: Python<'_>) -> PyResult<PyObject> {
        self.free_link(py, true)
    }

    #[getter]
    fn prev_free_block(&self, py: Python<'_>) -> PyResult<PyObject> {
        self.free_link(py, false)
    }

    #[getter]
    fn is_null(&self) -> bool {
        self.block_id == 0
    }

    #[getter]
    fn _native(&self, py: Python<'_>) -> PyObject {
        self.owner.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "KVCacheBlock(block_id={}, ref_cnt={})",
            self.block_id,
            self.ref_cnt(py)?
        ))
    }
}

/// The one view of block `block_id` of `owner` (a manager): vLLM keeps one
/// `KVCacheBlock` object per block, and its tests and connectors compare
/// blocks with `is`. The views live in the manager's `_block_views` list
/// (one slot per block, filled on first use; the manager's `__dict__`
/// holds it, so the garbage collector sees the cycle through `owner`).
/// Ids outside the pool get a fresh view (the reads on it then refuse them).
#[pyfunction]
pub fn block_view<'py>(
    owner: &Bound<'py, PyAny>,
    block_id: i64,
) -> PyResult<Bound<'py, BlockView>> {
    let py = owner.py();
    let table = owner.getattr(intern!(py, "_block_views"))?;
    let table = table.downcast::<PyList>()?;
    let slot = usize::try_from(block_id).ok().filter(|&i| i < table.len());
    if let Some(i) = slot {
        let cached = table.get_item(i)?;
        if !cached.is_none() {
            return Ok(cached.downcast_into::<BlockView>()?);
        }
    }
    let view = Bound::new(
        py,
        BlockView {
            owner: owner.clone().unbind(),
            block_id,
        },
    )?;
    if let Some(i) = slot {
        table.set_item(i, &view)?;
    }
    Ok(view)
}

/// The block ids of one group.
pub type GroupIds = SmallVec<[i64; 2]>;

/// Block ids per KV-cache group (vLLM's `KVCacheBlocks`); `blocks` builds
/// block views on demand.
#[pyclass(module = "hybridcache._native", name = "KVCacheBlocks", frozen)]
pub struct KVCacheBlocks {
    // Inline for up to four groups of up to two blocks (a decode result):
    // building one allocates nothing beyond the Python object.
    ids: SmallVec<[GroupIds; 4]>,
    owner: Option<PyObject>,
}

impl KVCacheBlocks {
    pub fn from_ids(ids: &[Vec<u32>], owner: PyObject) -> Self {
        Self::from_groups(ids.iter().map(Vec::as_slice), owner)
    }

    pub fn from_groups<'a>(groups: impl Iterator<Item = &'a [u32]>, owner: PyObject) -> Self {
        KVCacheBlocks {
            ids: groups
                .map(|g| g.iter().map(|&b| i64::from(b)).collect())
                .collect(),
            owner: Some(owner),
        }
    }

    pub fn ids(&self) -> &[GroupIds] {
        &self.ids
    }

    pub fn owner(&self) -> Option<&PyObject> {
        self.owner.as_ref()
    }

    fn groups<'py>(
        &self,
        py: Python<'py>,
        group_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<&GroupIds>> {
        let _ = py;
        match group_ids {
            None => Ok(self.ids.iter().collect()),
            Some(gs) if gs.is_none() => Ok(self.ids.iter().collect()),
            Some(gs) => crate::convert::int_list("group_ids", gs, true)?
                .into_iter()
                .map(|g| g as usize)
                .map(|g| {
                    self.ids
                        .get(g)
                        .ok_or_else(|| PyValueError::new_err(format!("no KV cache group {g}")))
                })
                .collect(),
        }
    }

    fn unhashed(&self, py: Python<'_>, skip_null: bool) -> PyResult<Vec<Vec<i64>>> {
        let mut out = Vec::with_capacity(self.ids.len());
        for g in &self.ids {
            let ids: Vec<i64> = g
                .iter()
                .copied()
                .filter(|&b| !(skip_null && b == 0))
                .collect();
            let flags: Vec<bool> = match &self.owner {
                Some(o) => o
                    .call_method1(py, "unhashed", (ids.clone(),))?
                    .extract(py)?,
                None => vec![true; ids.len()],
            };
            out.push(
                ids.into_iter()
                    .zip(flags)
                    .filter(|(_, u)| *u)
                    .map(|(b, _)| b)
                    .collect(),
            );
        }
        Ok(out)
    }
}

#[pymethods]
impl KVCacheBlocks {
    /// `KVCacheBlocks(block_ids, native=None)`: block ids per group; or,
    /// as vLLM's dataclass is built, `KVCacheBlocks(blocks=...)`: blocks
    /// per group (objects with `block_id`, or ids).
    #[new]
    #[pyo3(signature = (block_ids=None, native=None, *, blocks=None))]
    fn new(
        block_ids: Option<&Bound<'_, PyAny>>,
        native: Option<PyObject>,
        blocks: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (groups, objects) = match (block_ids, blocks) {
            (Some(ids), None) => (ids, false),
            (None, Some(blocks)) => (blocks, true),
            _ => {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "KVCacheBlocks() takes either block_ids or blocks=",
                ))
            }
        };
        let py = groups.py();
        let mut ids = SmallVec::new();
        for g in groups.try_iter()? {
            let mut group = GroupIds::new();
            for b in g?.try_iter()? {
                let mut b = b?;
                if objects && !b.is_instance_of::<pyo3::types::PyInt>() {
                    b = b.getattr(pyo3::intern!(py, "block_id"))?;
                }
                // Out-of-range ids are kept: allocate_slots rejects them by name.
                group.push(crate::convert::block_id_arg(&b)?);
            }
            ids.push(group);
        }
        Ok(KVCacheBlocks { ids, owner: native })
    }

    #[pyo3(signature = (allow_none=false, group_ids=None))]
    fn get_block_ids<'py>(
        &self,
        py: Python<'py>,
        allow_none: bool,
        group_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let groups = self.groups(py, group_ids)?;
        if allow_none && groups.iter().all(|g| g.is_empty()) {
            return Ok(None);
        }
        let lists = groups
            .iter()
            .map(|g| PyList::new(py, g.iter()))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Some(PyTuple::new(py, lists)?))
    }

    /// Block views per group (vLLM's `KVCacheBlocks.blocks`).
    #[getter]
    fn blocks<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.get();
        let Some(owner) = &this.owner else {
            // A manager's shared empty result is not bound to it (so the
            // manager holding it makes no reference cycle): no views needed.
            if this.ids.iter().all(|g| g.is_empty()) {
                let empty = this.ids.iter().map(|_| PyList::empty(py));
                return PyTuple::new(py, empty);
            }
            return Err(PyValueError::new_err(
                "these KVCacheBlocks are not bound to a manager",
            ));
        };
        let lists = this
            .ids
            .iter()
            .map(|g| {
                let views = g
                    .iter()
                    .map(|&b| block_view(owner.bind(py), b))
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, views)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    #[getter]
    fn _ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let lists = self
            .ids
            .iter()
            .map(|g| PyList::new(py, g.iter()))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, lists)
    }

    #[getter]
    fn _native(&self, py: Python<'_>) -> Option<PyObject> {
        self.owner.as_ref().map(|o| o.clone_ref(py))
    }

    fn get_unhashed_block_ids(&self, py: Python<'_>) -> PyResult<Vec<i64>> {
        if self.ids.len() != 1 {
            return Err(PyValueError::new_err(
                "get_unhashed_block_ids supports only one KV cache group",
            ));
        }
        Ok(self.unhashed(py, false)?.remove(0))
    }

    /// Unhashed block ids per group, null (padding) blocks left out.
    fn get_unhashed_block_ids_all_groups(&self, py: Python<'_>) -> PyResult<Vec<Vec<i64>>> {
        self.unhashed(py, true)
    }

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let Ok(other) = other.downcast::<KVCacheBlocks>() else {
            return Ok(py.NotImplemented());
        };
        let other = other.get();
        if self.ids.len() != other.ids.len() {
            return Err(PyValueError::new_err(format!(
                "cannot add KVCacheBlocks of {} groups to KVCacheBlocks of {} groups",
                other.ids.len(),
                self.ids.len()
            )));
        }
        let ids = self
            .ids
            .iter()
            .zip(&other.ids)
            .map(|(a, b)| a.iter().chain(b).copied().collect())
            .collect();
        let owner = self
            .owner
            .as_ref()
            .or(other.owner.as_ref())
            .map(|o| o.clone_ref(py));
        Ok(Bound::new(py, KVCacheBlocks { ids, owner })?
            .into_any()
            .unbind())
    }

    fn new_empty(&self, py: Python<'_>) -> KVCacheBlocks {
        KVCacheBlocks {
            ids: (0..self.ids.len()).map(|_| GroupIds::new()).collect(),
            owner: self.owner.as_ref().map(|o| o.clone_ref(py)),
        }
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .downcast::<KVCacheBlocks>()
            .is_ok_and(|o| o.get().ids == self.ids)
    }

    fn __repr__(&self) -> String {
        let groups: Vec<String> = self.ids.iter().map(|g| format!("{g:?}")).collect();
        format!(
            "KVCacheBlocks(({}))",
            groups.join(", ") + if groups.len() == 1 { "," } else { "" }
        )
    }
}
