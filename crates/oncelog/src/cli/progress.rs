//! Progress of `produce` and `consume` on stderr.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Progress on stderr: once a second while running (when asked or when
/// stderr is a terminal).
pub(super) struct Progress {
    on: bool,
    tty: bool,
    what: &'static str,
    start: Instant,
    last: Instant,
}

impl Progress {
    /// `auto`: whether a terminal on stderr may show it unasked (not when the
    /// same terminal shows the records or the typing).
    pub(super) fn new(asked: bool, auto: bool, what: &'static str) -> Self {
        let tty = std::io::stderr().is_terminal();
        Self {
            on: asked || (tty && auto),
            tty,
            what,
            start: Instant::now(),
            last: Instant::now(),
        }
    }

    pub(super) fn tick(&mut self, n: u64) {
        if !self.on || self.last.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "{} {n} records ({:.0}/s, {:.0} s)",
            self.what,
            n as f64 / secs,
            secs
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    }

    pub(super) fn done(&self) {
        if self.on && self.tty {
            eprintln!();
        }
    }
}
