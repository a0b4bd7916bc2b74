//! Copying a byte-range batch out of the registered buffer into the
//! caller's buffers, with its probabilities and weights.

use std::mem::MaybeUninit;

use super::{buffer_bytes, DataPlaneState, RangedDraw, RowBytes};
use crate::client::cluster::{global_probability, ClientCore};
use crate::client::weights::WeightNorm;
use crate::client::BatchRows;
use crate::error::{Error, Result};

impl ClientCore {
    /// Copies the rows of `drawn` out of the buffer into `columns`
    /// (zeroing padding) and their fields into `out`, with probabilities
    /// and weights as the shard-gather path computes them.
    pub(super) fn assemble_into(
        &self,
        st: &DataPlaneState,
        drawn: &RangedDraw,
        columns: &mut [&mut [MaybeUninit<u8>]],
        out: &mut BatchRows,
    ) -> Result<()> {
        let RangedDraw { place, rows, lost, rejoined, masses, mins, total, beta } = drawn;
        let Some((region, _)) = &st.buffer else { return Err(Error::Config("no batch buffer".into())) };
        let bytes = buffer_bytes(region);
        if columns.len() != place.step_bytes.len() {
            return Err(Error::Config(format!(
                "{} column buffers for the {} columns requested",
                columns.len(),
                place.step_bytes.len()
            )));
        }
        for (c, (buf, &s)) in columns.iter().zip(&place.step_bytes).enumerate() {
            let need = (s * place.window) as usize * rows.len();
            if buf.len() < need {
                return Err(Error::Config(format!("column {c}: a buffer of {} bytes for {need}", buf.len())));
            }
        }
        let mut norm = WeightNorm::default();
        for (s, (&mass, &min)) in masses.iter().zip(mins).enumerate() {
            if mass > 0.0 && *total > 0.0 && !rows.iter().any(|r| r.shard == s) {
                norm.smallest_probability(min / total);
            }
        }
        for row in rows {
            if row.reported_total > 0.0 {
                norm.smallest_probability(row.reported_min / row.reported_total * row.mass / row.total);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            for (c, &s) in place.step_bytes.iter().enumerate() {
                let w = (place.window * s) as usize;
                let dst = &mut columns[c][r * w..(r + 1) * w];
                let range = match &row.bytes {
                    RowBytes::Remote(range) => range,
                    RowBytes::Gathered(gathered) => {
                        write_bytes(dst, &gathered[c]);
                        continue;
                    }
                };
                let base = (place.column_base(c) + r as u64 * place.window * s) as usize;
                let (lo, hi) = ((range.dst_step * s) as usize, ((range.dst_step + row.len) * s) as usize);
                write_zeros(&mut dst[..lo]);
                write_bytes(&mut dst[lo..hi], &bytes[base + lo..base + hi]);
                write_zeros(&mut dst[hi..]);
            }
            out.keys.push(row.key);
            out.lengths.push(row.len);
            out.starts.push(row.start);
            let p = global_probability(row.p_local, row.mass, row.total);
            norm.row(p);
            out.probabilities.push(p);
        }
        out.weights.extend(out.probabilities.iter().map(|&p| norm.weight(p, *beta)));
        out.lost.extend_from_slice(lost);
        out.rejoined.extend_from_slice(rejoined);
        Ok(())
    }
}

/// Copies `src` into `dst` (the same length).
fn write_bytes(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        d.write(b);
    }
}

/// Zeroes `dst` (padding).
fn write_zeros(dst: &mut [MaybeUninit<u8>]) {
    dst.fill(MaybeUninit::new(0));
}
