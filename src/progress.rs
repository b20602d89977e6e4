//! Progress of a training epoch on stderr: a bar redrawn in place on a
//! terminal, and elsewhere (a log file, CI, a pipe) a plain line every few
//! seconds, so that a slow run never looks like a hang.

use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Shortest time between two redraws of the bar on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// Time between two plain lines where stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(10);
/// Characters of the bar.
const BAR_WIDTH: usize = 30;

/// One epoch's progress: `steps` steps, counted with [`inc`](Self::inc), with
/// a message (loss, rate) beside the count.
pub struct Progress {
    label: String,
    steps: u64,
    terminal: bool,
    start: Instant,
    state: RefCell<State>,
}

struct State {
    done: u64,
    message: String,
    /// When the bar was last drawn or the last line printed (the start at first).
    drawn: Instant,
}

impl Progress {
    /// Progress of epoch `epoch` (counting from 0) of `epochs`, over `steps` steps.
    pub fn epoch(epoch: usize, epochs: usize, steps: usize) -> Self {
        Self::with_output(
            format!("epoch {}/{epochs}", epoch + 1),
            steps,
            std::io::stderr().is_terminal(),
        )
    }

    fn with_output(label: String, steps: usize, terminal: bool) -> Self {
        Self {
            label,
            steps: steps as u64,
            terminal,
            start: Instant::now(),
            state: RefCell::new(State {
                done: 0,
                message: String::new(),
                drawn: Instant::now(),
            }),
        }
    }

    /// The message shown beside the count from the next draw on.
    pub fn set_message(&self, message: impl Into<String>) {
        self.state.borrow_mut().message = message.into();
    }

    /// Counts `steps` more steps done, and draws if it is time to.
    pub fn inc(&self, steps: u64) {
        let mut state = self.state.borrow_mut();
        state.done = (state.done + steps).min(self.steps);
        let every = if self.terminal {
            REDRAW_EVERY
        } else {
            LINE_EVERY
        };
        if state.drawn.elapsed() >= every || (self.terminal && state.done == self.steps) {
            state.drawn = Instant::now();
            self.draw(&state, "");
        }
    }

    /// Ends the epoch with `message` on a line of its own.
    pub fn finish_with_message(self, message: impl Into<String>) {
        let mut state = self.state.borrow_mut();
        state.message = message.into();
        self.draw(&state, "\n");
    }

    /// Ends the epoch leaving no line behind (the caller prints its own).
    pub fn finish_and_clear(self) {
        if self.terminal {
            eprint!("\r\x1b[2K");
        }
    }

    fn draw(&self, state: &State, end: &str) {
        let line = self.line(state);
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not stop training.
        let _ = if self.terminal {
            write!(err, "\r\x1b[2K{line}{end}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// The text of one draw: on a terminal `epoch 1/10 [=====>   ] 12/40
    /// loss 2.1`, elsewhere `epoch 1/10 12/40 steps in 9 s loss 2.1`.
    fn line(&self, state: &State) -> String {
        let (bar, steps) = if self.terminal {
            let filled = (state.done * BAR_WIDTH as u64 / self.steps.max(1)) as usize;
            let head = if filled < BAR_WIDTH { ">" } else { "" };
            let rest = BAR_WIDTH - filled - head.len();
            let bar = format!(" [{}{head}{}]", "=".repeat(filled), " ".repeat(rest));
            (bar, String::new())
        } else {
            let elapsed = self.start.elapsed().as_secs();
            (String::new(), format!(" steps in {elapsed} s"))
        };
        format!(
            "{}{bar} {}/{}{steps} {}",
            self.label, state.done, self.steps, state.message
        )
        .trim_end()
        .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_carries_the_count_and_message_without_a_bar() {
        let progress = Progress::with_output("epoch 2/3".into(), 40, false);
        progress.set_message("loss 2.1000");
        progress.state.borrow_mut().done = 12;
        let line = progress.line(&progress.state.borrow());
        assert!(line.starts_with("epoch 2/3 12/40 steps in "), "{line}");
        assert!(
            line.ends_with(" s loss 2.1000") && !line.contains('['),
            "{line}"
        );
    }

    #[test]
    fn the_terminal_bar_fills_with_the_count() {
        let progress = Progress::with_output("epoch 1/1".into(), 4, true);
        let state = |done| State {
            done,
            message: String::new(),
            drawn: Instant::now(),
        };
        let half = progress.line(&state(2));
        assert!(half.starts_with("epoch 1/1 [===============>"), "{half}");
        assert!(half.ends_with("] 2/4"), "{half}");
        let full = progress.line(&state(4));
        assert_eq!(full, format!("epoch 1/1 [{}] 4/4", "=".repeat(BAR_WIDTH)));
    }
}
