//! The tokens of the tool calls an assistant message carries in its META
//! `tool_calls` member (spec §2, v3), as each model family's prompt renders
//! them: OpenAI's shape (`{"id","type","function":{"name","arguments"}}`,
//! `arguments` a JSON string) or LangChain's (`{"id","name","args"}`, `args`
//! an object). docs/MODELS.md says per family what is exact; the sources of
//! every format are in docs/notes/tool-call-tokens.md.
//!
//! Special tokens of a template count 1 each; the text between two of them
//! is counted as one string (BPE merges across a template's text seams).
//! Arguments given as an object are written as Python's `json.dumps(x,
//! ensure_ascii=False)` writes them (", " and ": "), as HF templates'
//! `tojson`, langchain_openai and mistral-common do.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::Encoding;

/// How a model's prompt renders an assistant's tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// OpenAI's hosted models (format not published) and the models counted
    /// with the default encoding: name + arguments + [`OPENAI_CALL_OVERHEAD`].
    OpenAi,
    /// gpt-oss (openai-harmony): every call its own message.
    Harmony,
    /// Qwen 2.5 / 3: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
    Qwen,
    /// DeepSeek V3.1+: `<｜tool▁call▁begin｜>name<｜tool▁sep｜>args<｜tool▁call▁end｜>`.
    DeepSeek,
    /// GLM-4.5 / 4.6 / 4.7: name, then `<arg_key>`/`<arg_value>` per argument, with newlines.
    Glm4,
    /// GLM-5: as GLM-4.5 without the newlines.
    Glm5,
    /// Kimi K2: the call's id (`functions.name:idx`) and its arguments.
    Kimi,
    /// MiniMax M2: `<invoke name=…>` and `<parameter name=…>` text in one block.
    MiniMax,
    /// Llama 3.x: `{"type": "function", "name": …, "parameters": …}` per call
    /// (Meta's llama-models).
    Llama3,
    /// Mistral (Tekken, mistral-common's V3 request encoding): `[TOOL_CALLS]`
    /// and the calls as one JSON list.
    Mistral,
}

/// Tokens an OpenAI-hosted model's prompt adds per tool call beyond its name
/// and arguments: fitted to the two public `usage` figures that isolate one
/// call (4 on gpt-3.5-turbo, 5 on gpt-4; docs/notes/tool-call-tokens.md §2),
/// the higher kept so caps and thresholds err on the safe side.
pub const OPENAI_CALL_OVERHEAD: u64 = 5;

impl ToolFormat {
    /// The format of `model`'s prompt, whose encoding is `encoding`.
    pub fn of(model: &str, encoding: Encoding) -> ToolFormat {
        let lower = model.to_ascii_lowercase();
        match encoding {
            Encoding::O200kBase if lower.starts_with("gpt-oss") => ToolFormat::Harmony,
            Encoding::O200kBase | Encoding::Cl100kBase => ToolFormat::OpenAi,
            Encoding::Llama3 => ToolFormat::Llama3,
            Encoding::DeepseekV3 => ToolFormat::DeepSeek,
            Encoding::Qwen2 => ToolFormat::Qwen,
            Encoding::Glm4 => ToolFormat::Glm4,
            Encoding::Glm5 => ToolFormat::Glm5,
            Encoding::KimiK2 => ToolFormat::Kimi,
            Encoding::MinimaxM2 => ToolFormat::MiniMax,
            Encoding::Tekken => ToolFormat::Mistral,
        }
    }
}

/// One call, in either shape.
struct ToolCall {
    id: Option<String>,
    name: String,
    args: Args,
}

enum Args {
    /// OpenAI's `arguments`: the JSON text the model wrote.
    Text(String),
    /// LangChain's `args` (or an `arguments` object).
    Json(Value),
}

impl Args {
    /// The text a client sends the API: OpenAI's string as it is, an object
    /// as langchain_openai writes it.
    fn as_sent(&self) -> String {
        match self {
            Args::Text(t) => t.clone(),
            Args::Json(v) => python_json(v),
        }
    }

    /// What a template's `arguments if string else tojson` prints.
    fn verbatim_or_json(&self) -> String {
        self.as_sent()
    }

    /// The arguments as an object (GLM and MiniMax print them one by one).
    fn object(&self) -> Option<Map<String, Value>> {
        let value = match self {
            Args::Text(t) => serde_json::from_str::<Value>(t).ok()?,
            Args::Json(v) => v.clone(),
        };
        match value {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }

    /// The arguments as a value, as mistral-common and a server before a
    /// template make them: OpenAI's string parsed when it is JSON, else the
    /// string itself.
    fn parsed(&self) -> Value {
        match self {
            Args::Text(t) => serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.clone())),
            Args::Json(v) => v.clone(),
        }
    }
}

/// A value as a template prints one argument: a string verbatim, any other
/// value as `tojson`.
fn arg_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => python_json(other),
    }
}

#[derive(Deserialize)]
struct MetaToolCalls<'a> {
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireCall {
    id: Option<Value>,
    name: Option<Value>,
    args: Option<Value>,
    arguments: Option<Value>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: Option<Value>,
    arguments: Option<Value>,
}

fn text_of(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

impl From<WireCall> for ToolCall {
    fn from(c: WireCall) -> ToolCall {
        let (name, arguments) = match c.function {
            Some(f) => (f.name.or(c.name), f.arguments.or(c.arguments).or(c.args)),
            None => (c.name, c.args.or(c.arguments)),
        };
        let args = match arguments {
            Some(Value::String(s)) => Args::Text(s),
            Some(Value::Null) | None => Args::Json(Value::Object(Map::new())),
            Some(v) => Args::Json(v),
        };
        ToolCall {
            id: text_of(c.id),
            name: text_of(name).unwrap_or_default(),
            args,
        }
    }
}

/// The calls of a META text; `Err` with the raw member when it is not a list
/// of call objects (counted then as its JSON text: never less than it holds).
fn parse(meta: &str) -> Result<Vec<ToolCall>, Option<&str>> {
    // Most messages carry none: no parse for them.
    if !meta.contains("tool_calls") {
        return Ok(Vec::new());
    }
    let Ok(member) = serde_json::from_str::<MetaToolCalls>(meta) else {
        return Ok(Vec::new());
    };
    let Some(raw) = member.tool_calls else {
        return Ok(Vec::new());
    };
    match serde_json::from_str::<Option<Vec<WireCall>>>(raw.get()) {
        Ok(calls) => Ok(calls
            .unwrap_or_default()
            .into_iter()
            .map(ToolCall::from)
            .collect()),
        Err(_) => Err(Some(raw.get())),
    }
}

/// The tokens the tool calls in `meta` add to a message whose content is
/// `content`, under `encoding` rendered as `format` does.
pub fn tool_call_tokens(encoding: Encoding, format: ToolFormat, content: &str, meta: &str) -> u64 {
    let count = |t: &str| encoding.count(t);
    match parse(meta) {
        Ok(calls) if calls.is_empty() => 0,
        Ok(calls) => render(format, &calls, content, &count),
        Err(raw) => raw.map_or(0, count),
    }
}

/// Tokens a `\n` adds right after `content`: BPE merges it with the
/// content's trailing punctuation or spaces (`.\n`, `:\n`, ` \n` are one
/// token each), so it is counted with the content's tail: from its last
/// letter or digit on (no pre-token joins a letter or digit to a newline).
fn newline_after(content: &str, count: &dyn Fn(&str) -> u64) -> u64 {
    let start = content
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_alphanumeric())
        .map_or(0, |(i, _)| i);
    let tail = content.get(start..).unwrap_or(content);
    count(&format!("{tail}\n")).saturating_sub(count(tail))
}

fn render(
    format: ToolFormat,
    calls: &[ToolCall],
    content: &str,
    count: &dyn Fn(&str) -> u64,
) -> u64 {
    let no_content = content.is_empty();
    let each = |f: &dyn Fn(usize, &ToolCall) -> u64| -> u64 {
        calls.iter().enumerate().map(|(i, c)| f(i, c)).sum()
    };
    match format {
        ToolFormat::OpenAi => {
            each(&|_, c| count(&c.name) + count(&c.args.as_sent()) + OPENAI_CALL_OVERHEAD)
        }
        // <|start|>assistant to=functions.NAME<|channel|>commentary
        // <|constrain|>json<|message|>ARGS<|call|>: five specials, the
        // texts between them rendered (and so counted) one by one.
        ToolFormat::Harmony => each(&|_, c| {
            5 + count("assistant")
                + count(&format!(" to=functions.{}", c.name))
                + count("commentary")
                + count(" ")
                + count("json")
                + count(&c.args.as_sent())
        }),
        // `\n` before every call but a first one with no content before it,
        // then <tool_call> TEXT </tool_call> (two added tokens).
        ToolFormat::Qwen => each(&|i, c| {
            let newline = match i {
                0 if no_content => 0,
                0 => newline_after(content, count),
                _ => count("\n"),
            };
            let text = format!(
                "\n{{\"name\": \"{}\", \"arguments\": {}}}\n",
                c.name,
                c.args.verbatim_or_json()
            );
            newline + 2 + count(&text)
        }),
        // <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜> once, three per call.
        ToolFormat::DeepSeek => {
            2 + each(&|_, c| 3 + count(&c.name) + count(&c.args.verbatim_or_json()))
        }
        ToolFormat::Glm4 | ToolFormat::Glm5 => {
            let nl = if format == ToolFormat::Glm4 { "\n" } else { "" };
            each(&|i, c| {
                let lead = match i {
                    0 if !no_content && !nl.is_empty() => newline_after(content, count),
                    _ => count(nl),
                };
                let head = lead + 2 + count(&format!("{}{nl}", c.name));
                head + match c.args.object() {
                    Some(map) => map
                        .iter()
                        .map(|(k, v)| 4 + count(k) + count(nl) + count(&arg_value(v)) + count(nl))
                        .sum::<u64>(),
                    None => count(&c.args.as_sent()),
                }
            })
        }
        // <|tool_calls_section_begin|> … <|tool_calls_section_end|> once;
        // per call three specials, the id (`functions.NAME:IDX`) and ARGS.
        ToolFormat::Kimi => {
            2 + each(&|i, c| {
                let id =
                    c.id.clone()
                        .unwrap_or_else(|| format!("functions.{}:{i}", c.name));
                3 + count(&id) + count(&c.args.verbatim_or_json())
            })
        }
        // `\n<minimax:tool_call>` TEXT `</minimax:tool_call>`: two specials,
        // every call's <invoke>/<parameter> text between them.
        ToolFormat::MiniMax => {
            let mut text = String::from("\n");
            for c in calls {
                text.push_str(&format!("<invoke name=\"{}\">\n", c.name));
                for (k, v) in c.args.object().unwrap_or_default() {
                    text.push_str(&format!(
                        "<parameter name=\"{k}\">{}</parameter>\n",
                        arg_value(&v)
                    ));
                }
                text.push_str("</invoke>\n");
            }
            let lead = if no_content {
                0
            } else {
                newline_after(content, count)
            };
            lead + 2 + count(&text)
        }
        // Meta's llama-models (ChatFormat, the JSON tool format): each call
        // `json.dumps({"type": "function", "name": …, "parameters": …})`
        // with Python's default ASCII escapes, the calls back to back.
        ToolFormat::Llama3 => {
            let text: String = calls
                .iter()
                .map(|c| {
                    let mut m = Map::new();
                    m.insert("type".into(), Value::String("function".into()));
                    m.insert("name".into(), Value::String(c.name.clone()));
                    m.insert("parameters".into(), c.args.parsed());
                    python_json_ascii(&Value::Object(m))
                })
                .collect();
            count(&text)
        }
        // [TOOL_CALLS] and json.dumps([{"name", "arguments", "id"}, …]).
        ToolFormat::Mistral => {
            let list: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let mut m = Map::new();
                    m.insert("name".into(), Value::String(c.name.clone()));
                    m.insert("arguments".into(), c.args.parsed());
                    if let Some(id) = c.id.as_ref().filter(|id| id.as_str() != "null") {
                        m.insert("id".into(), Value::String(id.clone()));
                    }
                    Value::Object(m)
                })
                .collect();
            1 + count(&python_json(&Value::Array(list)))
        }
    }
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it:
/// ", " between items, ": " after keys, keys in their order, floats as
/// Python's repr (serde_json's string escapes are Python's). Integers beyond
/// 64 bits were parsed as floats: Python keeps their digits (a rare miss).
pub fn python_json(value: &Value) -> String {
    write_python(value, false)
}

/// As [`python_json`], with Python's default `ensure_ascii=True`: every
/// character beyond ASCII as `\uXXXX` (UTF-16 units).
pub fn python_json_ascii(value: &Value) -> String {
    write_python(value, true)
}

fn write_python(value: &Value, ascii: bool) -> String {
    use serde::Serialize;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter { ascii });
    // Writing a Value into a Vec cannot fail.
    if value.serialize(&mut ser).is_err() {
        return value.to_string();
    }
    String::from_utf8(out).unwrap_or_else(|_| value.to_string())
}

struct PythonFormatter {
    ascii: bool,
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        value: f64,
    ) -> std::io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ascii || fragment.is_ascii() {
            return w.write_all(fragment.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut units) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// Python's `repr(float)`: the shortest digits that read back, in plain
/// notation for exponents -4 to 15 (`1.0`, `0.0001`), else `1e-05`, `1.5e+16`.
fn python_float(value: f64) -> String {
    // Rust's `{:e}` writes the shortest round-trip digits: "4.74089e1".
    let sci = format!("{value:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1.min(digits.len()));
    let mantissa = if rest.is_empty() {
        first.to_owned()
    } else {
        format!("{first}.{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{mantissa}e{esign}{:02}", exp.abs())
}

#[cfg(test)]
#[path = "tool_calls_tests.rs"]
mod tests;
