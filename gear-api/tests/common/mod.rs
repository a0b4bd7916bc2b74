//! Helpers shared by gear-api's test files.

use gear_core::{ColumnSpec, DType, RandomSource, Sampled, Selector, SlotKey, TableSpec};

/// Three columns of different dtypes and shapes (`obs` u8 `[6]`, `action`
/// i32, `reward` f32 `[2]`), trajectories of at most `t` steps.
pub fn spec3(t: u64, capacity: u64) -> TableSpec {
    TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![6]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![2]),
        ],
        t,
        capacity,
    )
    .unwrap()
}

/// Uniform selection with hooks, as a downstream strategy that misbehaves
/// would be: `refuse` turns inserts down, `tamper` changes each row drawn.
/// (Not every test file that includes this module uses it.)
#[allow(dead_code)]
pub struct HookedUniform {
    /// The strategy's name.
    pub name: &'static str,
    /// The uniform strategy underneath.
    pub inner: gear_sampler::Uniform,
    /// Refuses an insert of this priority when it returns true.
    pub refuse: fn(Option<f64>) -> bool,
    /// Applied to every row drawn.
    pub tamper: fn(&mut Sampled),
}

#[allow(dead_code)]
impl HookedUniform {
    /// Plain uniform selection under `name` until hooks are set.
    pub fn new(name: &'static str) -> Self {
        HookedUniform { name, inner: gear_sampler::Uniform::new(), refuse: |_| false, tamper: |_| {} }
    }
}

impl Selector for HookedUniform {
    fn name(&self) -> &str {
        self.name
    }
    fn prepare(&mut self, capacity: u64) -> gear_core::Result<()> {
        self.inner.prepare(capacity)
    }
    fn insert(&mut self, key: SlotKey, priority: Option<f64>) -> gear_core::Result<f64> {
        if (self.refuse)(priority) {
            return Err(gear_core::Error::Selection(format!(
                "{}: priority {} refused",
                self.name,
                priority.unwrap_or(f64::NAN)
            )));
        }
        self.inner.insert(key, priority)
    }
    fn update(&mut self, key: SlotKey, priority: f64) -> gear_core::Result<()> {
        self.inner.update(key, priority)
    }
    fn remove(&mut self, key: SlotKey) -> gear_core::Result<()> {
        self.inner.remove(key)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn sample(&mut self, n: usize, rng: &mut dyn RandomSource, out: &mut Vec<Sampled>) -> gear_core::Result<()> {
        let first = out.len();
        self.inner.sample(n, rng, out)?;
        out[first..].iter_mut().for_each(self.tamper);
        Ok(())
    }
}
