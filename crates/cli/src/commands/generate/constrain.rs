//! `generate`'s constrained-decoding flags: `--json-schema FILE`, `--grammar FILE` (Lark, in
//! llguidance's dialect) and `--regex RE`, compiled with the server's llguidance glue.
use anyhow::{bail, Context, Result};
use engine::sample::TokenConstraint;
use engine::LoadedModel;
use server::constrain::{Constraints, Grammar};
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
#[group(multiple = false)]
pub struct ConstrainArgs {
    /// Constrain the output to JSON matching this JSON schema file (compact JSON, no free whitespace).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to this Lark grammar file (llguidance's dialect; `%json {...}` embeds a schema).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to match this regular expression.
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
}

impl ConstrainArgs {
    /// The grammar asked for, read and parsed (not yet compiled).
    pub fn grammar(&self) -> Result<Option<Grammar>> {
        if let Some(f) = &self.json_schema {
            let text = std::fs::read_to_string(f).with_context(|| format!("cannot read the JSON schema {}", f.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", f.display()))?;
            if !schema.is_object() && !schema.is_boolean() {
                bail!("{} is not a JSON schema (an object)", f.display());
            }
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        if let Some(f) = &self.grammar {
            let text = std::fs::read_to_string(f).with_context(|| format!("cannot read the grammar {}", f.display()))?;
            return Ok(Some(Grammar::Lark(text)));
        }
        Ok(self.regex.clone().map(Grammar::Regex))
    }

    /// The compiled constraint for `loaded` (an error says why the grammar cannot be followed).
    pub fn compile(&self, loaded: &LoadedModel) -> Result<Option<Box<dyn TokenConstraint>>> {
        let Some(grammar) = self.grammar()? else { return Ok(None) };
        let flag = match grammar {
            Grammar::JsonSchema(_) => "--json-schema",
            Grammar::Lark(_) => "--grammar",
            Grammar::Regex(_) => "--regex",
        };
        let constraints = Constraints::new(loaded).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        let c = constraints.compile(&grammar).map_err(|e| anyhow::anyhow!("{flag}: the grammar cannot be followed: {e}"))?;
        Ok(Some(Box::new(c)))
    }
}
