//! Tokenizers, chat templates and streaming detokenizers (being written).
