//! Reading the user's messages: `rustyline` line editing and history on a terminal, plain lines otherwise; a line ending in `\` continues, `"""` opens and closes a block.
use anyhow::Result;
use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg, Termios};
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use std::io::{BufRead, IsTerminal};
use std::sync::Mutex;

/// One message, or why there is none.
pub enum Input {
    Message(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of standard input.
    Eof,
}

enum Source {
    Editor(Box<rustyline::Editor<(), DefaultHistory>>),
    Lines(std::io::StdinLock<'static>),
}

pub struct Reader {
    source: Source,
}

const PROMPT: &str = ">>> ";
const MORE: &str = "... ";

impl Reader {
    /// An editor when standard input and output are terminals, plain line reading otherwise.
    pub fn new() -> Result<Reader> {
        let source = if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            let config = rustyline::Config::builder().auto_add_history(false).build();
            Source::Editor(Box::new(rustyline::Editor::with_config(config)?))
        } else {
            Source::Lines(std::io::stdin().lock())
        };
        Ok(Reader { source })
    }

    pub fn interactive(&self) -> bool {
        matches!(self.source, Source::Editor(_))
    }

    fn line(&mut self, prompt: &str) -> Result<Option<String>, ReadlineError> {
        match &mut self.source {
            Source::Editor(ed) => match ed.readline(prompt) {
                Ok(l) => Ok(Some(l)),
                Err(ReadlineError::Eof) => Ok(None),
                Err(e) => Err(e),
            },
            Source::Lines(stdin) => {
                let mut l = String::new();
                if stdin.read_line(&mut l)? == 0 {
                    return Ok(None);
                }
                let trimmed = l.trim_end_matches(['\n', '\r']).len();
                l.truncate(trimmed);
                Ok(Some(l))
            }
        }
    }

    /// Reads one message, joining continued lines and `"""` blocks; empty lines are skipped.
    pub fn read(&mut self) -> Result<Input> {
        let mut parts: Vec<String> = Vec::new();
        let mut block = false;
        loop {
            let prompt = if parts.is_empty() && !block { PROMPT } else { MORE };
            let line = match self.line(prompt) {
                Ok(Some(l)) => l,
                Ok(None) if parts.is_empty() && !block => return Ok(Input::Eof),
                Ok(None) => break,
                Err(ReadlineError::Interrupted) => return Ok(Input::Interrupted),
                Err(e) => return Err(e.into()),
            };
            if block {
                if let Some(head) = line.trim_end().strip_suffix("\"\"\"") {
                    parts.push(head.to_owned());
                    break;
                }
                parts.push(line);
            } else if parts.is_empty() && line.trim_start().starts_with("\"\"\"") {
                let rest = line.trim_start()[3..].to_owned();
                if let Some(one) = rest.trim_end().strip_suffix("\"\"\"") {
                    parts.push(one.to_owned());
                    break;
                }
                block = true;
                if !rest.is_empty() {
                    parts.push(rest);
                }
            } else if let Some(head) = line.strip_suffix('\\') {
                parts.push(head.to_owned());
            } else {
                parts.push(line);
                break;
            }
        }
        let message = parts.join("\n");
        if message.trim().is_empty() {
            return self.read();
        }
        if let Source::Editor(ed) = &mut self.source {
            let _ = ed.add_history_entry(message.as_str());
        }
        Ok(Input::Message(message))
    }
}

/// The terminal's settings before an answer set NOFLSH (`None`: nothing to put back), for
/// [`restore_terminal`], also from the Ctrl-C handler.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// While an answer is written: the terminal keeps the output it holds when Ctrl-C turns into SIGINT (NOFLSH).
/// Without it the terminal discards its pending output right after sending the signal, and the answer's
/// last words or the "[stopped]" written in that moment can be lost. Dropping it puts the settings back.
pub struct KeepOutputOnInterrupt;

impl KeepOutputOnInterrupt {
    /// Sets NOFLSH when standard input is a terminal (nothing otherwise).
    pub fn new() -> KeepOutputOnInterrupt {
        let stdin = std::io::stdin();
        if let Some(original) = stdin.is_terminal().then(|| tcgetattr(&stdin).ok()).flatten() {
            let mut keep = original.clone();
            keep.local_flags.insert(LocalFlags::NOFLSH);
            *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(original);
            let _ = tcsetattr(&stdin, SetArg::TCSANOW, &keep);
        }
        KeepOutputOnInterrupt
    }
}

impl Drop for KeepOutputOnInterrupt {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Puts back the terminal settings an answer changed (also before the process leaves on a second Ctrl-C).
pub fn restore_terminal() {
    if let Some(original) = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &original);
    }
}
