//! `reasoning_content` for reasoning models: routes streamed text to the reasoning until
//! `</think>` and to the answer after it, holding back only what could still be a tag.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Not yet known whether the text opens with `<think>`.
    Undecided,
    Reasoning,
    Answer,
}

/// One choice's stream of text, split as `tokenizer::split_reasoning` splits a whole text.
#[derive(Debug)]
pub struct ReasoningStream {
    mode: Mode,
    pending: String,
    /// Drop whitespace at the start of the next reasoning / answer text.
    trim_next: bool,
}

/// Longest suffix of `s` that is a proper prefix of `tag` (text that might become the tag).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])).unwrap_or(0)
}

impl ReasoningStream {
    /// `opened_in_prompt`: the chat template ended the prompt with `<think>`.
    pub fn new(opened_in_prompt: bool) -> Self {
        let mode = if opened_in_prompt { Mode::Reasoning } else { Mode::Undecided };
        ReasoningStream { mode, pending: String::new(), trim_next: true }
    }

    /// Adds text; returns the (reasoning, answer) text that can be sent now.
    pub fn push(&mut self, text: &str) -> (String, String) {
        self.pending.push_str(text);
        let (mut reasoning, mut answer) = (String::new(), String::new());
        loop {
            match self.mode {
                Mode::Undecided => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.pending = rest.to_owned();
                        self.mode = Mode::Reasoning;
                        self.trim_next = true;
                    } else if OPEN.starts_with(t) {
                        return (reasoning, answer); // may still become "<think>"
                    } else {
                        self.mode = Mode::Answer;
                        self.trim_next = false;
                    }
                }
                Mode::Reasoning => {
                    if self.trim_next {
                        self.pending = self.pending.trim_start().to_owned();
                        self.trim_next = self.pending.is_empty();
                    }
                    if let Some(j) = self.pending.find(CLOSE) {
                        reasoning.push_str(&self.pending[..j]);
                        self.pending = self.pending[j + CLOSE.len()..].to_owned();
                        self.mode = Mode::Answer;
                        self.trim_next = true;
                    } else {
                        let keep = partial_tag(&self.pending, CLOSE);
                        let cut = self.pending.len() - keep;
                        reasoning.push_str(&self.pending[..cut]);
                        self.pending.drain(..cut);
                        return (reasoning, answer);
                    }
                }
                Mode::Answer => {
                    if self.trim_next {
                        self.pending = self.pending.trim_start().to_owned();
                        self.trim_next = self.pending.is_empty();
                    }
                    answer.push_str(&self.pending);
                    self.pending.clear();
                    return (reasoning, answer);
                }
            }
        }
    }

    /// The end of the text: whatever was held back.
    pub fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        match self.mode {
            Mode::Reasoning => (rest, String::new()),
            Mode::Undecided | Mode::Answer => (String::new(), if self.trim_next { rest.trim_start().to_owned() } else { rest }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizer::split_reasoning;

    fn stream(pieces: &[&str], opened: bool) -> (String, String) {
        let mut s = ReasoningStream::new(opened);
        let (mut r, mut a) = (String::new(), String::new());
        for p in pieces {
            let (x, y) = s.push(p);
            r.push_str(&x);
            a.push_str(&y);
        }
        let (x, y) = s.finish();
        (r + &x, a + &y)
    }

    #[test]
    fn streaming_splits_like_the_whole_text() {
        let cases: &[(&[&str], bool)] = &[
            (&["<th", "ink>\nLet me", " add.</th", "ink>\n\n4"], false),
            (&["Let me add.\n</", "think>", "4"], true),
            (&["plain ", "answer"], false),
            (&["<", "b>bold</b>"], false),
            (&["still thinking"], true),
        ];
        for (pieces, opened) in cases {
            let whole: String = pieces.concat();
            let (r, a) = split_reasoning(&whole, *opened);
            let (sr, sa) = stream(pieces, *opened);
            assert_eq!(sa, a, "{pieces:?}");
            assert_eq!(sr.trim(), r.unwrap_or_default(), "{pieces:?}");
        }
    }
}
