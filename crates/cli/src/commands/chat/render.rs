//! Streams an answer to the terminal with `<think>…</think>` reasoning dimmed apart from the answer, or hidden.
use std::io::{self, Write};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// A control character a terminal may act on: C0 but tab and line breaks, DEL, and C1.
fn is_unsafe_control(c: char) -> bool {
    c.is_control() && !matches!(c, '\t' | '\n' | '\r')
}

/// Splits streamed text into reasoning and answer; tags may arrive split over several pieces.
pub struct Renderer {
    thinking: bool,
    /// Text held back because it may be the start of a tag.
    held: String,
    /// Whether ANSI styling is used (stdout is a terminal).
    ansi: bool,
    hide: bool,
    /// Nothing of the answer has been written yet (leading newlines after reasoning are dropped).
    answer_started: bool,
    wrote_reasoning: bool,
}

impl Renderer {
    pub fn new(ansi: bool, hide: bool) -> Renderer {
        Renderer { thinking: false, held: String::new(), ansi, hide, answer_started: false, wrote_reasoning: false }
    }

    /// Starts an answer; `thinking` when the prompt already opened a `<think>` block.
    pub fn begin(&mut self, out: &mut dyn Write, thinking: bool) -> io::Result<()> {
        if thinking {
            self.enter_thinking(out)?;
        }
        Ok(())
    }

    fn enter_thinking(&mut self, out: &mut dyn Write) -> io::Result<()> {
        self.thinking = true;
        if !self.hide && self.ansi {
            write!(out, "{DIM}")?;
        } else if !self.hide {
            write!(out, "{OPEN}")?;
        }
        Ok(())
    }

    fn leave_thinking(&mut self, out: &mut dyn Write) -> io::Result<()> {
        self.thinking = false;
        if !self.hide && self.ansi {
            write!(out, "{RESET}")?;
            if self.wrote_reasoning {
                writeln!(out, "\n")?;
            }
        } else if !self.hide {
            write!(out, "{CLOSE}")?;
        }
        self.answer_started = false;
        Ok(())
    }

    fn emit(&mut self, out: &mut dyn Write, text: &str) -> io::Result<()> {
        if self.thinking {
            if !self.hide {
                self.wrote_reasoning |= !text.trim().is_empty();
                self.write_text(out, text)?;
            }
            return Ok(());
        }
        let text = if self.answer_started || !self.ansi && !self.hide { text } else { text.trim_start_matches('\n') };
        self.answer_started |= !text.is_empty();
        self.write_text(out, text)
    }

    /// Writes the model's text; on a terminal its control characters (other than tab and line
    /// breaks) are shown in caret notation (ESC as `^[`, as `cat -v`) and C1 controls as U+FFFD,
    /// so that generated text cannot send escape sequences to the terminal.
    fn write_text(&self, out: &mut dyn Write, text: &str) -> io::Result<()> {
        if !self.ansi || !text.chars().any(is_unsafe_control) {
            return write!(out, "{text}");
        }
        let mut shown = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            match c {
                c if !is_unsafe_control(c) => shown.push(c),
                '\u{7f}' => shown.push_str("^?"),
                c if (c as u32) < 0x20 => {
                    shown.push('^');
                    shown.push(char::from(b'@' + c as u8));
                }
                _ => shown.push('\u{fffd}'),
            }
        }
        write!(out, "{shown}")
    }

    /// Writes the next piece of streamed text.
    pub fn push(&mut self, out: &mut dyn Write, piece: &str) -> io::Result<()> {
        self.held.push_str(piece);
        loop {
            let tag = if self.thinking { CLOSE } else { OPEN };
            if let Some(at) = self.held.find(tag) {
                let before = self.held[..at].to_owned();
                self.held.drain(..at + tag.len());
                self.emit(out, &before)?;
                if self.thinking {
                    self.leave_thinking(out)?;
                } else {
                    self.enter_thinking(out)?;
                }
                continue;
            }
            // Keep back the longest tail that could start the tag.
            let keep = (1..tag.len()).rev().find(|&n| self.held.ends_with(&tag[..n])).unwrap_or(0);
            let cut = self.held.len() - keep;
            let ready = self.held[..cut].to_owned();
            self.held.drain(..cut);
            self.emit(out, &ready)?;
            return Ok(());
        }
    }

    /// Writes what was held back and leaves the dimmed style.
    pub fn finish(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let rest = std::mem::take(&mut self.held);
        self.emit(out, &rest)?;
        if self.thinking && self.ansi && !self.hide {
            write!(out, "{RESET}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Renderer;

    fn run(pieces: &[&str], start: bool, ansi: bool, hide: bool) -> String {
        let mut out = Vec::new();
        let mut r = Renderer::new(ansi, hide);
        r.begin(&mut out, start).unwrap();
        for p in pieces {
            r.push(&mut out, p).unwrap();
        }
        r.finish(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn reasoning_is_dimmed_or_hidden() {
        let pieces = ["<thi", "nk>\nhmm", "</th", "ink>\n\nHello", " <world"];
        assert_eq!(run(&pieces, false, true, false), "\x1b[2m\nhmm\x1b[0m\n\nHello <world");
        assert_eq!(run(&pieces, false, true, true), "Hello <world");
        assert_eq!(run(&pieces, false, false, false), "<think>\nhmm</think>\n\nHello <world");
        assert_eq!(run(&["plan</think>ok"], true, true, true), "ok");
        assert_eq!(run(&["plan</think>ok"], true, true, false), "\x1b[2mplan\x1b[0m\n\nok");
    }

    #[test]
    fn generated_control_characters_reach_a_terminal_as_visible_text() {
        // A random model's byte tokens once wrote ESC: a terminal (and a test's ANSI stripping) took the
        // "\n[s" after it for an escape sequence.
        let pieces = ["a\x1b", "[31mred\tb\r\n\u{7}\u{7f}\u{9b}", "<think>\x1bx</think>"];
        assert_eq!(run(&pieces, false, true, false), "a^[[31mred\tb\r\n^G^?\u{fffd}\x1b[2m^[x\x1b[0m\n\n");
        // Not a terminal: the text as generated.
        assert_eq!(run(&pieces, false, false, false), "a\x1b[31mred\tb\r\n\u{7}\u{7f}\u{9b}<think>\x1bx</think>");
    }
}
