//! What `tail` draws: on a TTY, a block of live lines at the bottom — one per open run,
//! redrawn in place like a build's progress view — with lasting lines (finals, settle
//! summaries, errors) printed above it; elsewhere only the lasting lines.
//!
//! Colour (ANSI) only on a TTY and never when `NO_COLOR` is set.

use std::io::Write as _;

/// ANSI styles, or nothing when colour is off.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

impl Style {
    fn wrap(self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
    pub fn bold(self, s: &str) -> String {
        self.wrap("1", s)
    }
    pub fn dim(self, s: &str) -> String {
        self.wrap("2", s)
    }
    pub fn green(self, s: &str) -> String {
        self.wrap("32", s)
    }
    pub fn red(self, s: &str) -> String {
        self.wrap("31", s)
    }
    pub fn yellow(self, s: &str) -> String {
        self.wrap("33", s)
    }
    pub fn cyan(self, s: &str) -> String {
        self.wrap("36", s)
    }
}

/// The live block and the lasting lines above it.
pub struct Screen {
    tty: bool,
    pub style: Style,
    width: usize,
    /// Open runs' live lines, in the order the runs started.
    lines: Vec<(String, String)>,
    /// Lines of the block on screen now.
    drawn: usize,
}

/// `s` cut to `max` characters (a live line never wraps: wrapping breaks the redraw).
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

impl Screen {
    /// A screen for stdout: `tty` draws the live block, `color` styles it.
    pub fn new(tty: bool, color: bool) -> Screen {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(100usize)
            .max(40);
        Screen {
            tty,
            style: Style { color },
            width,
            lines: Vec::new(),
            drawn: 0,
        }
    }

    /// Sets the live line of `run` (a new run gets a new line at the bottom).
    pub fn live(&mut self, run: &str, text: &str) {
        if !self.tty {
            return;
        }
        match self.lines.iter_mut().find(|(r, _)| r == run) {
            Some((_, t)) if t == text => return,
            Some((_, t)) => text.clone_into(t),
            None => self.lines.push((run.to_owned(), text.to_owned())),
        }
        self.redraw(None);
    }

    /// Removes the live line of `run`.
    pub fn done(&mut self, run: &str) {
        let before = self.lines.len();
        self.lines.retain(|(r, _)| r != run);
        if self.tty && self.lines.len() != before {
            self.redraw(None);
        }
    }

    /// Prints `text` as lasting lines above the live block.
    pub fn lasting(&mut self, text: &str) {
        if self.tty {
            self.redraw(Some(text));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
    }

    /// Clears the block, prints `above` (if any), draws the block again.
    fn redraw(&mut self, above: Option<&str>) {
        let mut buf = String::new();
        if self.drawn > 0 {
            buf.push_str(&format!("\x1b[{}A\r", self.drawn));
        }
        buf.push_str("\x1b[J");
        if let Some(text) = above {
            buf.push_str(text);
            buf.push('\n');
        }
        let dot = self.style.green("●");
        for (run, text) in &self.lines {
            let line = fit(&format!("{run:<20} {text}"), self.width.saturating_sub(3));
            buf.push_str(&format!("{dot} {line}\n"));
        }
        self.drawn = self.lines.len();
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(buf.as_bytes());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_lines_never_wrap() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }

    #[test]
    fn no_colour_means_plain_text() {
        let s = Style { color: false };
        assert_eq!(s.bold("x"), "x");
        assert_eq!(Style { color: true }.bold("x"), "\x1b[1mx\x1b[0m");
    }
}
