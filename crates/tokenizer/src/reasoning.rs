//! Separating a reasoning model's `<think>…</think>` part from its answer (DeepSeek-R1 and its
//! distills, Qwen3): for `--output json`'s `reasoning`, chat's dimmed display and the server's
//! `reasoning_content`.

/// The reasoning and the answer of a generated `text`. `opened_in_prompt`: the chat template
/// already wrote `<think>` at the end of the prompt (R1 distills do), so the text starts inside the
/// reasoning. Without any think marker there is no reasoning and the whole text is the answer.
pub fn split_reasoning(text: &str, opened_in_prompt: bool) -> (Option<String>, String) {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    let (inside, opened) = match text.find(OPEN) {
        Some(i) if text[..i].trim().is_empty() => (&text[i + OPEN.len()..], true),
        _ => (text, opened_in_prompt),
    };
    if !opened {
        return (None, text.to_owned());
    }
    match inside.find(CLOSE) {
        Some(j) => (Some(inside[..j].trim().to_owned()), inside[j + CLOSE.len()..].trim_start().to_owned()),
        None => (Some(inside.trim().to_owned()), String::new()),
    }
}

/// Whether a rendered prompt leaves the model inside `<think>` (ends with the opening tag).
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<think>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_forms_models_produce() {
        let (r, a) = split_reasoning("<think>\nLet me add.\n</think>\n\n2 + 2 = 4", false);
        assert_eq!((r.as_deref(), a.as_str()), (Some("Let me add."), "2 + 2 = 4"));
        let (r, a) = split_reasoning("Let me add.\n</think>\n4", true);
        assert_eq!((r.as_deref(), a.as_str()), (Some("Let me add."), "4"));
        let (r, a) = split_reasoning("still thinking", true);
        assert_eq!((r.as_deref(), a.as_str()), (Some("still thinking"), ""));
        let (r, a) = split_reasoning("plain answer", false);
        assert_eq!((r, a.as_str()), (None, "plain answer"));
        let (r, a) = split_reasoning("use <think> tags like </think> this", false);
        assert_eq!((r, a.as_str()), (None, "use <think> tags like </think> this"));
        assert!(prompt_opens_reasoning("<|Assistant|><think>\n"));
        assert!(!prompt_opens_reasoning("<|Assistant|>"));
    }
}
