//! Helpers shared by gear-api's test files.

use gear_core::{ColumnSpec, DType, TableSpec};

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
