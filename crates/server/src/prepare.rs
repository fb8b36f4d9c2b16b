//! A request's prompt made ready off the engine thread: its structured-output plan, the chat
//! template rendered, the text tokenised, and the checks that need only the tokenizer and the
//! model's sizes (token ids in the vocabulary, the context length, top-k and logit-bias ids). The
//! HTTP handler runs it on tokio's blocking pool and sends the tokens in the [`crate::worker::Job`];
//! the engine thread only checks what needs the grammar compiler (`structured::check`).
use crate::api::{ApiError, GenParams, Prompt};
use crate::structured::Plan;
use crate::tools::ToolFormat;
use engine::LoadedModel;
use std::sync::Arc;
use tokenizer::Tokenizer;

/// What preparing a prompt needs of the loaded model (made on the engine thread at load).
pub struct Preparer {
    tokenizer: Arc<Tokenizer>,
    tool_format: Option<ToolFormat>,
    vocab: i32,
    /// `max_position_embeddings`, if the config has it.
    context: Option<u64>,
}

/// A prompt made ready: its tokens, whether a reasoning model's template left it inside
/// `<think>` (chat with a reasoning model; `None` otherwise), and its plan.
pub struct Prepared {
    pub tokens: Vec<u32>,
    pub reasoning: Option<bool>,
    pub plan: Plan,
}

impl Preparer {
    pub fn new(loaded: &LoadedModel) -> Preparer {
        Preparer {
            tokenizer: loaded.tokenizer.clone(),
            tool_format: loaded.tokenizer.chat_template_source().and_then(ToolFormat::detect),
            vocab: loaded.model.vocab_size(),
            context: loaded.config.get("max_position_embeddings").and_then(|v| v.as_u64()),
        }
    }

    /// The chat template's tool-call format, if it has one.
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.tool_format
    }

    /// Renders and tokenises `prompt` and checks it and `params` against the model.
    pub fn prepare(&self, prompt: &Prompt, params: &GenParams) -> Result<Prepared, ApiError> {
        let tok = &self.tokenizer;
        let plan = crate::structured::plan(tok, self.tool_format, params)?;
        let mut reasoning = None;
        let (tokens, param) = match prompt {
            Prompt::Chat(messages) => {
                let text = tok.apply_chat_template_json(messages, true, plan.template_tools.as_ref(), &[]).map_err(|e| ApiError::bad("messages", e.to_string()))?;
                if tok.has_thinking() {
                    reasoning = Some(tokenizer::prompt_opens_reasoning(&text));
                }
                (tok.encode(&text, false).map_err(|e| ApiError::bad("messages", e.to_string()))?, "messages")
            }
            Prompt::Text(text) => (tok.encode(text, true).map_err(|e| ApiError::bad("prompt", e.to_string()))?, "prompt"),
            Prompt::Tokens(ids) => (ids.clone(), "prompt"),
        };
        let vocab = self.vocab;
        if tokens.is_empty() {
            return Err(ApiError::bad(param, "the prompt encodes to no tokens"));
        }
        if let Some(bad) = tokens.iter().find(|&&t| i64::from(t) >= i64::from(vocab)) {
            return Err(ApiError::bad(param, format!("token id {bad} is outside the vocabulary (ids 0..{})", vocab - 1)));
        }
        if let Some(ctx) = self.context {
            if tokens.len() as u64 >= ctx {
                let mut e = ApiError::bad(param, format!("the prompt has {} tokens; the model's context is {ctx}", tokens.len()));
                e.code = Some("context_length_exceeded");
                return Err(e);
            }
        }
        let sampler = &params.sampler;
        let without_bias = engine::SamplerConfig { processors: Default::default(), ..sampler.clone() };
        without_bias.validate_vocab(vocab).map_err(|e| ApiError::bad("top_k", e.to_string()))?;
        sampler.processors.validate_vocab(vocab).map_err(|e| ApiError::bad("logit_bias", e.to_string()))?;
        Ok(Prepared { tokens, reasoning, plan })
    }
}
