//! Stop strings over streamed text: text is released only once it can no longer be part of a stop string, so no partial stop string is ever emitted.

/// Holds back the tail of the generated text that could still grow into a stop string.
#[derive(Debug, Default)]
pub struct StopBuffer {
    stops: Vec<String>,
    held: String,
    /// The stop string that ended the text, once one did.
    matched: Option<String>,
}

impl StopBuffer {
    pub fn new(stops: Vec<String>) -> StopBuffer {
        StopBuffer { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    /// Adds `text`; returns the text that is safe to emit, and whether a stop string was found (the
    /// stop string and everything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some((pos, stop)) = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|p| (p, s))).min_by_key(|(p, _)| *p) {
            self.matched = Some(stop.clone());
            let out = self.held[..pos].to_owned();
            self.held.clear();
            return (out, true);
        }
        let cut = self.safe_len();
        let out: String = self.held.drain(..cut).collect();
        (out, false)
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// The held-back text, released at the end of generation (no stop string completed).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest prefix of `held` whose remainder is not a proper prefix of a stop string.
    fn safe_len(&self) -> usize {
        for (i, _) in self.held.char_indices() {
            let tail = &self.held[i..];
            if self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail)) {
                return i;
            }
        }
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::StopBuffer;

    #[test]
    fn holds_back_possible_prefixes() {
        let mut b = StopBuffer::new(vec!["END".into()]);
        assert_eq!(b.push("hello E"), ("hello ".into(), false));
        assert_eq!(b.push("N"), ("".into(), false));
        assert_eq!(b.push("X"), ("ENX".into(), false));
        assert_eq!(b.push("a EN"), ("a ".into(), false));
        assert_eq!(b.push("D tail"), ("".into(), true));
    }

    #[test]
    fn earliest_stop_wins_and_flush_releases() {
        let mut b = StopBuffer::new(vec!["cd".into(), "b".into()]);
        assert_eq!(b.push("abcd"), ("a".into(), true));
        assert_eq!(b.matched(), Some("b"));
        let mut b = StopBuffer::new(vec!["xyz".into()]);
        assert_eq!(b.push("éx"), ("é".into(), false));
        assert_eq!(b.flush(), "x");
        let mut none = StopBuffer::new(vec![]);
        assert_eq!(none.push("abc"), ("abc".into(), false));
    }
}
