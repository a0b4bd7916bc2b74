//! Running `gear` itself as child processes (actors, trainers, bench
//! writers) on one shared table, and collecting the one stats line each
//! prints when it ends.

use gear_api::{Error, Result};
use serde::{de::DeserializeOwned, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Prefix of the stats line a child prints last.
pub const STATS_PREFIX: &str = "GEAR-STATS ";

/// Prints a child's stats line.
pub fn print_stats<T: Serialize>(stats: &T) {
    println!("{STATS_PREFIX}{}", serde_json::to_string(stats).expect("stats serialise"));
}

/// A running child `gear` process.
#[derive(Debug)]
pub struct GearChild {
    role: String,
    child: Child,
    /// Kills the child if a signal ends this process first.
    _on_signal: crate::signals::Registered,
}

/// Starts `gear <args>` from the current executable.
pub fn spawn(role: &str, args: &[String]) -> Result<GearChild> {
    let exe = std::env::current_exe().map_err(|e| Error::Config(format!("cannot find the gear executable: {e}")))?;
    let child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::Config(format!("cannot start {role} process: {e}")))?;
    let _on_signal = crate::signals::kill_on_exit(child.id());
    Ok(GearChild { role: role.to_owned(), child, _on_signal })
}

impl GearChild {
    /// Waits for the child and parses its stats line.
    pub fn finish<T: DeserializeOwned>(mut self) -> Result<T> {
        let out = self.child.stdout.take().expect("stdout is piped");
        let mut stats = None;
        for line in BufReader::new(out).lines().map_while(std::result::Result::ok) {
            if let Some(json) = line.strip_prefix(STATS_PREFIX) {
                stats = Some(serde_json::from_str(json).map_err(|e| {
                    Error::Config(format!("{} process {} printed bad stats: {e}", self.role, self.child.id()))
                })?);
            }
        }
        let status = self.child.wait().map_err(|e| Error::Config(format!("waiting for {}: {e}", self.role)))?;
        match (status.success(), stats) {
            (true, Some(s)) => Ok(s),
            _ => Err(Error::Config(format!("{} process {} failed ({status})", self.role, self.child.id()))),
        }
    }
}

impl Drop for GearChild {
    fn drop(&mut self) {
        // A child left running (an error on the parent's side) is stopped.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
