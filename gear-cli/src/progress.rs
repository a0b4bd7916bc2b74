//! Progress lines for long-running commands: a phase name, a count and a
//! rate, redrawn in place on a terminal and printed a few times otherwise.

use std::cell::Cell;
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
    /// A line drawn in place on the terminal and not yet ended.
    open_line: Cell<bool>,
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
            open_line: Cell::new(false),
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
            self.open_line.set(true);
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }

    /// Ends a line drawn in place, so that what is printed next (a summary
    /// on stdout, an error) starts on a line of its own.
    pub fn end_line(&self) {
        if self.open_line.replace(false) {
            let _ = writeln!(std::io::stderr());
        }
    }

    /// Ends the phase with its duration.
    pub fn done(&mut self) {
        if !self.enabled {
            return;
        }
        let text = format!("{}: {} in {:.2?}", self.phase, self.total, self.started.elapsed());
        let mut err = std::io::stderr().lock();
        self.open_line.set(false);
        if self.tty {
            let _ = writeln!(err, "\r\x1b[2K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
    }
}
