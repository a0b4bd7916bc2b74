//! Progress lines for long-running commands: a phase name, a count and a
//! rate, redrawn in place on a terminal and printed a few times otherwise.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Shows progress on stderr; silent when disabled (`--json`, tests).
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    tty: bool,
    phase: String,
    total: u64,
    started: Instant,
    last: Instant,
}

impl Progress {
    /// A progress display; `enabled = false` prints nothing.
    pub fn new(enabled: bool) -> Self {
        let now = Instant::now();
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
            phase: String::new(),
            total: 0,
            started: now,
            last: now,
        }
    }

    /// Starts a phase of `total` units.
    pub fn phase(&mut self, name: &str, total: u64) {
        self.phase = name.to_owned();
        self.total = total;
        self.started = Instant::now();
        self.last = self.started;
    }

    /// Reports `done` units; draws at most a few times a second.
    pub fn tick(&mut self, done: u64) {
        let interval = if self.tty { Duration::from_millis(200) } else { Duration::from_secs(2) };
        if !self.enabled || self.last.elapsed() < interval {
            return;
        }
        self.last = Instant::now();
        self.line(&format!(
            "{}: {done}/{} ({:.0}/s)",
            self.phase,
            self.total,
            done as f64 / self.started.elapsed().as_secs_f64()
        ));
    }

    /// Prints a free-form status line.
    pub fn line(&self, text: &str) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }

    /// Ends the phase with its duration.
    pub fn done(&mut self) {
        if !self.enabled {
            return;
        }
        let text = format!("{}: {} in {:.2?}", self.phase, self.total, self.started.elapsed());
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = writeln!(err, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
    }
}
