//! Windows ("subscription patterns", SPEC.md): which steps of a stored
//! trajectory go into a batch row, and where in the row they land.
//!
//! With `k` the stored length, `s` the offset (negative counts from the end)
//! and `l` the window length: `start = s` if `s >= 0`, else `max(k+s, 0)`;
//! `end = min(start+l, k)`; `n = max(end-start, 0)` steps are copied. Tail
//! padding puts them at `[0, n)` of the row, head padding at `[l-n, l)`; the
//! rest of the row is zero and the row's valid length is `n`.

use crate::error::{Error, Result};

/// Where the zero padding of a short window goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Pad {
    /// Real steps first, zeros after (`[0, n)` holds data).
    #[default]
    Tail,
    /// Zeros first, real steps last (`[l-n, l)` holds data).
    Head,
}

/// A window of `len` steps starting at `offset` (negative: from the end).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowSpec {
    /// Start step; negative values count back from the stored length.
    pub offset: i64,
    /// Steps per batch row.
    pub len: u64,
    /// Where padding goes when fewer than `len` steps are available.
    pub pad: Pad,
}

/// Where one row's steps come from and go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedWindow {
    /// First stored step to copy.
    pub src_step: u64,
    /// First row position to write.
    pub dst_step: u64,
    /// Steps copied (the row's valid length).
    pub steps: u64,
}

impl WindowSpec {
    /// A window of the last `len` steps, head-padded (the usual choice for
    /// sequence models that predict from the most recent context).
    pub fn last(len: u64) -> Self {
        WindowSpec { offset: -(len.min(i64::MAX as u64) as i64), len, pad: Pad::Head }
    }

    /// A window of the first `len` steps, tail-padded.
    pub fn first(len: u64) -> Self {
        WindowSpec { offset: 0, len, pad: Pad::Tail }
    }

    /// Whole trajectories of a table with maximum length `max_len`.
    pub fn whole(max_len: u64) -> Self {
        Self::first(max_len)
    }

    /// Checks the window against the table's maximum length.
    pub fn validate(&self, max_len: u64) -> Result<()> {
        if self.len == 0 {
            return Err(Error::InvalidWindow("window length is zero".into()));
        }
        if self.len > max_len {
            return Err(Error::InvalidWindow(format!(
                "window length {} exceeds the table's maximum trajectory length {max_len}",
                self.len
            )));
        }
        Ok(())
    }

    /// Applies the SPEC rule to a trajectory of stored length `k`.
    #[inline]
    pub fn resolve(&self, k: u64) -> ResolvedWindow {
        let start = if self.offset >= 0 { self.offset as u64 } else { k.saturating_sub(self.offset.unsigned_abs()) };
        let end = start.saturating_add(self.len).min(k);
        let steps = end.saturating_sub(start);
        let dst_step = match self.pad {
            Pad::Tail => 0,
            Pad::Head => self.len - steps,
        };
        ResolvedWindow { src_step: if steps == 0 { 0 } else { start }, dst_step, steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The rule restated one step at a time, as the spec reads.
    fn naive(k: i64, s: i64, l: i64, pad: Pad) -> Vec<Option<i64>> {
        let start = if s >= 0 { s } else { (k + s).max(0) };
        let end = (start + l).min(k);
        let n = (end - start).max(0);
        (0..l)
            .map(|j| {
                let i = match pad {
                    Pad::Tail => j,
                    Pad::Head => j - (l - n),
                };
                (0..n).contains(&i).then_some(start + i)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn resolve_matches_the_per_step_rule(k in 0i64..50, s in -60i64..60, l in 1i64..50, head in any::<bool>()) {
            let pad = if head { Pad::Head } else { Pad::Tail };
            let w = WindowSpec { offset: s, len: l as u64, pad };
            let r = w.resolve(k as u64);
            let got: Vec<Option<i64>> = (0..l as u64)
                .map(|j| (j >= r.dst_step && j < r.dst_step + r.steps).then(|| (r.src_step + j - r.dst_step) as i64))
                .collect();
            prop_assert_eq!(got, naive(k, s, l, pad));
        }
    }

    #[test]
    fn validate_names_the_problem() {
        assert!(WindowSpec::first(0).validate(10).unwrap_err().to_string().contains("zero"));
        assert!(WindowSpec::first(11).validate(10).unwrap_err().to_string().contains("exceeds"));
        assert!(WindowSpec::last(10).validate(10).is_ok());
    }
}
