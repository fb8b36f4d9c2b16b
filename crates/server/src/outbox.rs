//! A request's events on their way from the engine thread to its handler, through a bounded
//! channel ([`EVENT_QUEUE`] events). The engine never waits on a slow reader: when the channel is
//! full the events are held here and the newest text of each choice is merged into its last held
//! delta, so what is held stays at most two events per choice (a delta and its finish) however
//! long the reader takes; the reader gets the text in larger pieces once it catches up.
use crate::worker::Event;
use std::cell::RefCell;
use std::collections::VecDeque;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;

/// Events a request's channel holds at most.
pub const EVENT_QUEUE: usize = 64;

/// The sending end of one request's events.
pub struct Outbox {
    tx: Sender<Event>,
    held: RefCell<VecDeque<Event>>,
}

impl Outbox {
    pub fn new(tx: Sender<Event>) -> Outbox {
        Outbox { tx, held: RefCell::new(VecDeque::new()) }
    }

    /// Whether the reader went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends `ev` now, or holds it (merged) while the channel is full. Returns whether events are
    /// held (the engine flushes them later with [`Outbox::flush`]).
    pub fn send(&self, ev: Event) -> bool {
        let mut held = self.held.borrow_mut();
        if held.is_empty() {
            match self.tx.try_send(ev) {
                Ok(()) | Err(TrySendError::Closed(_)) => return false,
                Err(TrySendError::Full(ev)) => {
                    held.push_back(ev);
                    return true;
                }
            }
        }
        hold(&mut held, ev);
        true
    }

    /// Sends held events while the channel has room; returns whether some are still held.
    pub fn flush(&self) -> bool {
        let mut held = self.held.borrow_mut();
        while let Some(ev) = held.pop_front() {
            match self.tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Closed(_)) => {
                    held.clear();
                    return false;
                }
                Err(TrySendError::Full(ev)) => {
                    held.push_front(ev);
                    return true;
                }
            }
        }
        false
    }

    /// Events held now.
    pub fn held(&self) -> usize {
        self.held.borrow().len()
    }
}

/// Adds `ev` behind the held events: a delta joins its choice's last held delta.
fn hold(held: &mut VecDeque<Event>, ev: Event) {
    if let Event::Delta { index, text, logprobs } = ev {
        let last = held.iter_mut().rev().find(|e| matches!(e, Event::Delta { index: i, .. } | Event::Finish { index: i, .. } if *i == index));
        if let Some(Event::Delta { text: t, logprobs: l, .. }) = last {
            t.push_str(&text);
            l.extend(logprobs);
            return;
        }
        held.push_back(Event::Delta { index, text, logprobs });
        return;
    }
    held.push_back(ev);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(index: usize, text: &str) -> Event {
        Event::Delta { index, text: text.into(), logprobs: Vec::new() }
    }

    /// A reader that does not read: the engine's sends never wait, what is held stays two events
    /// per choice, and the reader gets every piece of text in order once it reads.
    #[test]
    fn a_slow_reader_is_held_merged_and_gets_everything() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(EVENT_QUEUE);
        let out = Outbox::new(tx);
        let mut want = [String::new(), String::new()];
        for i in 0..10_000 {
            let index = i % 2;
            let piece = format!("<{i}>");
            want[index].push_str(&piece);
            out.send(delta(index, &piece));
        }
        for index in 0..2 {
            out.send(Event::Finish { index, reason: "length", completion_tokens: 5000, note: None, stop_sequence: None, drafted: None });
        }
        assert!(out.held() <= 4, "{} events held", out.held());
        let mut got = [String::new(), String::new()];
        let mut finished = 0;
        while finished < 2 {
            out.flush();
            let Ok(ev) = rx.try_recv() else { break };
            match ev {
                Event::Delta { index, text, .. } => got[index].push_str(&text),
                Event::Finish { .. } => finished += 1,
                _ => {}
            }
        }
        assert_eq!(got, want);
        assert_eq!(out.held(), 0);
    }

    #[test]
    fn a_reader_that_left_drops_what_was_held() {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let out = Outbox::new(tx);
        for i in 0..5 {
            out.send(delta(0, &i.to_string()));
        }
        assert!(out.held() > 0);
        drop(rx);
        assert!(out.is_closed());
        assert!(!out.flush());
        assert_eq!(out.held(), 0);
    }
}
