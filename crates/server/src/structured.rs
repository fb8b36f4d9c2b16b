//! One request's structured-output plan, made with the prompt off the engine thread ([`crate::prepare`]):
//! the tools its chat template is given, the grammar its output must follow (a forced tool call
//! for `tool_choice` `required` or a named function, else `response_format`), and the tool-call
//! format its answer is parsed with. Every impossible request is a 400 naming the field.
use crate::api::{ApiError, GenParams};
use crate::constrain::{compact_json, Constraints, Grammar};
use crate::tools::ToolFormat;
use tokenizer::Tokenizer;
use serde_json::{json, Value};

pub struct Plan {
    /// The template's `tools` variable.
    pub template_tools: Option<Value>,
    pub grammar: Option<Grammar>,
    /// Set when the answer is parsed for tool calls.
    pub tool_format: Option<ToolFormat>,
    /// The field a grammar that does not compile is blamed on.
    pub grammar_param: &'static str,
}

/// The plan for `params` (`chat`: a chat request, whose template may take tools).
pub fn plan(tok: &Tokenizer, format: Option<ToolFormat>, params: &GenParams) -> Result<Plan, ApiError> {
    let tools = &params.tools;
    let mut plan = Plan { template_tools: None, grammar: None, tool_format: None, grammar_param: "response_format" };
    if tools.active() {
        let Some(format) = format else {
            return Err(ApiError::bad("tools", "this model's chat template does not support tool calls (no tool-call format found in it)"));
        };
        plan.template_tools = Some(Value::Array(tools.tools.clone()));
        plan.tool_format = Some(format);
        if let Some(forced) = tools.forced() {
            let template = tok.chat_template_source().unwrap_or_default();
            let lark = format.forced_grammar(&forced, tools.parallel, template, &|s| tok.token_to_id(s));
            plan.grammar = Some(Grammar::Lark(lark));
            plan.grammar_param = "tools";
            return Ok(plan);
        }
    }
    if let Some(rf) = &params.response_format {
        plan.grammar = Some(match &rf.grammar {
            Grammar::JsonSchema(schema) => Grammar::JsonSchema(schema_options(schema, !rf.strict)),
            g => g.clone(),
        });
    }
    Ok(plan)
}

/// `schema` with compact JSON and, unless `strict`, llguidance's lenient mode (schema keywords it
/// does not support are ignored rather than refused).
fn schema_options(schema: &Value, lenient: bool) -> Value {
    let had_options = schema.get("x-guidance").is_some();
    let mut schema = compact_json(schema);
    if !had_options && lenient {
        schema["x-guidance"]["lenient"] = json!(true);
    }
    schema
}

/// Checks that `plan`'s grammar compiles, and with active tools that each tool's `parameters`
/// schema does (a 400 naming the field otherwise). Without a grammar compiler for this tokenizer,
/// only a plan that needs one fails.
pub fn check(plan: &Plan, params: &GenParams, constraints: Result<&Constraints, &String>) -> Result<(), ApiError> {
    if let (Ok(c), true) = (constraints, params.tools.active()) {
        for (i, t) in params.tools.tools.iter().enumerate() {
            if let Some(schema) = t["function"].get("parameters").filter(|p| p.is_object()) {
                let strict = t["function"]["strict"].as_bool().unwrap_or(false);
                c.compile(&Grammar::JsonSchema(schema_options(schema, !strict)))
                    .map_err(|e| ApiError::bad(&format!("tools[{i}].function.parameters"), format!("the schema cannot be followed: {}", crate::api::clip_long(&e))))?;
            }
        }
    }
    let Some(g) = &plan.grammar else { return Ok(()) };
    let c = constraints.map_err(|e| ApiError::bad(plan.grammar_param, format!("constrained decoding is not available for this model: {e}")))?;
    c.compile(g).map(|_| ()).map_err(|e| ApiError::bad(plan.grammar_param, format!("the schema cannot be followed: {}", crate::api::clip_long(&e))))
}
