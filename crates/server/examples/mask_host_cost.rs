//! Host cost per token of constrained decoding's mask for a real vocabulary: committing a token
//! and computing the next mask, as llguidance's packed words (what every path applies now) against
//! one flag per token packed again (what the generator and speculative verification did before).
//!
//! `cargo run --release -p server --example mask_host_cost -- MODEL_DIR [TOKENS]`: MODEL_DIR holds
//! tokenizer.json and config.json (e.g. the staged Qwen2.5-Coder-0.5B-Instruct, 151,936 ids). A
//! JSON schema whose one field is a free string (the widest masks); each step commits an allowed
//! word (letters only) once inside the string, else the first allowed token. Prints the trie's and a
//! schema's compile time, then microseconds per token of each way, then microseconds a step of 8
//! such rows as the batch engine commits and masks them (`commit_and_mask`; with `SERIAL` set, each
//! row in turn on this thread, for comparison).
use engine::sample::constraint::{bit_is_set, pack_bits, TokenConstraint};
use server::constrain::{Constraints, Grammar};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: mask_host_cost MODEL_DIR [TOKENS]")?);
    let tokens: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json"))?)?;
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let vocab = config["vocab_size"].as_u64().ok_or("config.json has no vocab_size")? as usize;
    let eos: Vec<u32> = match &config["eos_token_id"] {
        serde_json::Value::Array(ids) => ids.iter().filter_map(|v| v.as_u64().map(|i| i as u32)).collect(),
        v => v.as_u64().map(|i| vec![i as u32]).unwrap_or_default(),
    };
    let t0 = Instant::now();
    let cs = Constraints::from_tokenizer_json(&tok, vocab, &eos)?;
    println!("vocabulary {vocab}: factory {:.1} ms", 1e3 * t0.elapsed().as_secs_f64());
    // Ids whose text is letters alone (with byte-level's space mark): they keep the string going.
    let mut wordy = vec![false; vocab];
    for (text, id) in tok["model"]["vocab"].as_object().ok_or("tokenizer.json has no model.vocab")? {
        if let Some(i) = id.as_u64().filter(|&i| (i as usize) < vocab) {
            wordy[i as usize] = text.chars().all(|ch| ch.is_ascii_alphabetic() || ch == '\u{120}');
        }
    }
    // Inside the string a word (the widest mask), else the first token allowed (the structure).
    let pick = |words: &[u32]| -> Option<u32> {
        let allowed = |t: &u32| bit_is_set(words, *t) && !eos.contains(t);
        (1000..vocab as u32).filter(|t| wordy[*t as usize]).find(allowed).or_else(|| (0..vocab as u32).find(allowed))
    };
    let schema = serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    let t0 = Instant::now();
    let mut first = cs.compile(&Grammar::JsonSchema(schema.clone()))?;
    let t1 = Instant::now();
    first.allowed_bits(vocab)?;
    println!("schema compile {:.2} ms, first mask {:.2} ms", 1e3 * (t1 - t0).as_secs_f64(), 1e3 * t1.elapsed().as_secs_f64());
    for packed in [true, false] {
        let mut c = cs.compile(&Grammar::JsonSchema(schema.clone()))?;
        let (mut mask_s, mut commit_s, mut steps) = (0.0, 0.0, 0);
        let mut words = c.allowed_bits(vocab)?;
        for _ in 0..tokens {
            let Some(t) = pick(&words) else { break };
            let t1 = Instant::now();
            c.commit(t)?;
            let t2 = Instant::now();
            words = if packed { c.allowed_bits(vocab)? } else { pack_bits(&c.allowed(vocab)?) };
            mask_s += t2.elapsed().as_secs_f64();
            commit_s += (t2 - t1).as_secs_f64();
            steps += 1;
        }
        let per = |s: f64| 1e6 * s / steps.max(1) as f64;
        let way = if packed { "packed words (allowed_bits)" } else { "flags then packed (allowed + pack_bits)" };
        println!("{way}: {steps} tokens, commit {:.1} us, mask {:.1} us per token", per(commit_s), per(mask_s));
    }
    // A batch step's 8 constrained rows, as the batch engine commits and masks them.
    let rows = 8;
    let mut cs8: Vec<Box<dyn TokenConstraint>> = (0..rows).map(|_| cs.compile(&Grammar::JsonSchema(schema.clone())).map(|c| Box::new(c) as Box<dyn TokenConstraint>)).collect::<Result<_, _>>()?;
    let mut words: Vec<Vec<u32>> = cs8.iter_mut().map(|c| c.allowed_bits(vocab)).collect::<Result<_, _>>()?;
    let (mut total, mut steps) = (0.0, 0);
    for _ in 0..tokens {
        let Some(picks) = words.iter().map(|w| pick(w)).collect::<Option<Vec<u32>>>() else { break };
        let t0 = Instant::now();
        let masks = if std::env::var("SERIAL").is_ok() {
            cs8.iter_mut().zip(picks).map(|(c, t)| { c.commit(t)?; c.allowed_bits(vocab).map(Some) }).collect::<Result<Vec<_>, _>>()?
        } else {
            engine::sample::constraint::commit_and_mask(cs8.iter_mut().map(Some).zip(picks).collect(), vocab)?
        };
        total += t0.elapsed().as_secs_f64();
        steps += 1;
        words = masks.into_iter().map(|m| m.unwrap_or_default()).collect();
    }
    println!("{rows} rows (commit_and_mask): {steps} steps, {:.1} us a step", 1e6 * total / steps.max(1) as f64);
    Ok(())
}
