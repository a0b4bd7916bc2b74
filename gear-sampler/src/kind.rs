//! Picking a strategy by name, for command lines and config files.

use std::fmt;
use std::str::FromStr;

use gear_core::Selector;

use crate::{Error, Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Result, Uniform};

/// The valid strategy names, for error messages.
pub(crate) const STRATEGY_NAMES: &str = "uniform, prioritized, fifo, lifo, max-heap, min-heap";

/// The built-in strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StrategyKind {
    /// [`Uniform`].
    Uniform,
    /// [`Prioritized`].
    Prioritized,
    /// [`Fifo`].
    Fifo,
    /// [`Lifo`].
    Lifo,
    /// [`MaxHeap`].
    MaxHeap,
    /// [`MinHeap`].
    MinHeap,
}

impl StrategyKind {
    /// Every kind, in the order of [`StrategyKind::name`]s in messages.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::Uniform,
        StrategyKind::Prioritized,
        StrategyKind::Fifo,
        StrategyKind::Lifo,
        StrategyKind::MaxHeap,
        StrategyKind::MinHeap,
    ];

    /// The name [`FromStr`] accepts and [`Selector::name`] reports.
    pub const fn name(self) -> &'static str {
        match self {
            StrategyKind::Uniform => "uniform",
            StrategyKind::Prioritized => "prioritized",
            StrategyKind::Fifo => "fifo",
            StrategyKind::Lifo => "lifo",
            StrategyKind::MaxHeap => "max-heap",
            StrategyKind::MinHeap => "min-heap",
        }
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyKind {
    type Err = Error;

    /// Accepts the names of [`StrategyKind::name`], ignoring ASCII case and
    /// surrounding whitespace, with `_` for `-` (`max_heap`).
    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        StrategyKind::ALL.into_iter().find(|k| k.name() == wanted).ok_or_else(|| Error::UnknownStrategy(s.to_owned()))
    }
}

/// Parameters for [`build`]; only [`StrategyKind::Prioritized`] reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StrategyParams {
    /// Priority exponent (see [`crate::PrioritizedBuilder::alpha`]).
    pub alpha: f64,
    /// Importance-sampling exponent (see [`crate::PrioritizedBuilder::beta`]).
    pub beta: f64,
    /// Stratified batches (see [`crate::PrioritizedBuilder::stratified`]).
    pub stratified: bool,
}

impl Default for StrategyParams {
    /// `alpha` 0.6, `beta` 0.4, stratified.
    fn default() -> Self {
        StrategyParams { alpha: Prioritized::DEFAULT_ALPHA, beta: Prioritized::DEFAULT_BETA, stratified: true }
    }
}

/// Builds an empty strategy of `kind`; the table then calls
/// [`Selector::prepare`]. Fails only on invalid prioritized parameters.
pub fn build(kind: StrategyKind, params: &StrategyParams) -> Result<Box<dyn Selector>> {
    Ok(match kind {
        StrategyKind::Uniform => Box::new(Uniform::new()),
        StrategyKind::Prioritized => Box::new(
            Prioritized::builder().alpha(params.alpha).beta(params.beta).stratified(params.stratified).build()?,
        ),
        StrategyKind::Fifo => Box::new(Fifo::new()),
        StrategyKind::Lifo => Box::new(Lifo::new()),
        StrategyKind::MaxHeap => Box::new(MaxHeap::new()),
        StrategyKind::MinHeap => Box::new(MinHeap::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_build_reports_its_name() {
        for kind in StrategyKind::ALL {
            assert_eq!(kind.name().parse::<StrategyKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.name());
            assert!(STRATEGY_NAMES.contains(kind.name()));
            let s = build(kind, &StrategyParams::default()).unwrap();
            assert_eq!(s.name(), kind.name());
        }
        assert_eq!(" Max_Heap ".parse::<StrategyKind>().unwrap(), StrategyKind::MaxHeap);
    }

    #[test]
    fn strategies_name_the_rule_a_device_can_run() {
        use gear_core::SelectionRule;
        let p = StrategyParams { alpha: 0.7, beta: 0.3, stratified: false };
        let rule = |k| build(k, &p).unwrap().selection_rule();
        assert_eq!(rule(StrategyKind::Uniform), Some(SelectionRule::Uniform));
        assert_eq!(
            rule(StrategyKind::Prioritized),
            Some(SelectionRule::Proportional { alpha: 0.7, beta: 0.3, stratified: false })
        );
        assert_eq!(rule(StrategyKind::MaxHeap), Some(SelectionRule::TopK));
        for k in [StrategyKind::Fifo, StrategyKind::Lifo, StrategyKind::MinHeap] {
            assert_eq!(rule(k), None, "{k}");
        }
        // An annealed beta is what the rule reports next.
        let mut s = crate::Prioritized::new(0.6, 0.4).unwrap();
        s.set_beta(0.9).unwrap();
        assert_eq!(s.selection_rule(), Some(SelectionRule::Proportional { alpha: 0.6, beta: 0.9, stratified: true }));
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = "random".parse::<StrategyKind>().unwrap_err();
        assert_eq!(e, Error::UnknownStrategy("random".into()));
        let msg = e.to_string();
        assert!(msg.contains("`random`") && msg.contains(STRATEGY_NAMES), "{msg}");
        let core: gear_core::Error = e.into();
        assert!(matches!(core, gear_core::Error::InvalidSpec(_)));
    }

    #[test]
    fn bad_parameters_are_refused() {
        for (alpha, beta) in
            [(-0.1, 0.4), (f64::NAN, 0.4), (f64::INFINITY, 0.4), (0.6, 1.5), (0.6, -0.1), (0.6, f64::NAN)]
        {
            let p = StrategyParams { alpha, beta, stratified: true };
            let e = build(StrategyKind::Prioritized, &p).err().expect("refused");
            assert!(matches!(e, Error::InvalidParameter { .. }), "{e}");
        }
        let p = StrategyParams { alpha: 0.0, beta: 1.0, stratified: false };
        assert!(build(StrategyKind::Prioritized, &p).is_ok());
    }
}
