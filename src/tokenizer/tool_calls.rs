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

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

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
        // On every write's path: no allocation (no lowercased copy).
        let gpt_oss = model
            .get(..7)
            .is_some_and(|p| p.eq_ignore_ascii_case("gpt-oss"));
        match encoding {
            Encoding::O200kBase if gpt_oss => ToolFormat::Harmony,
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

/// Calls rendered one by one; past this many in one message, each further
/// call counts as its JSON text plus [`UNRENDERED_CALL_TOKENS`] (more than
/// any template adds to a call), so the work and memory of a count stay
/// proportional to its META whatever a client sends (a META of 1.4 million
/// empty calls built 1.8 GB of call values through Redis's allocator).
pub const MAX_RENDERED_CALLS: usize = 1024;
/// What a call beyond [`MAX_RENDERED_CALLS`] adds beside its JSON text.
pub const UNRENDERED_CALL_TOKENS: u64 = 16;

/// One call, in either shape, borrowing the META text.
struct Call<'a> {
    id: Option<String>,
    name: String,
    args: Args<'a>,
}

enum Args<'a> {
    /// OpenAI's `arguments`: the JSON text the model wrote.
    Text(String),
    /// LangChain's `args` (or an `arguments` object): its raw JSON.
    Json(&'a str),
    /// None given: `{}`.
    Empty,
}

impl Args<'_> {
    /// The text a client sends the API: OpenAI's string as it is, an object
    /// as langchain_openai writes it (`json.dumps`). Also what a template's
    /// `arguments if string else tojson` prints.
    fn as_sent(&self) -> Cow<'_, str> {
        match self {
            Args::Text(t) => Cow::Borrowed(t),
            Args::Json(raw) => {
                Cow::Owned(python_text(raw, false).unwrap_or_else(|| (*raw).to_owned()))
            }
            Args::Empty => Cow::Borrowed("{}"),
        }
    }

    /// The arguments re-written as a server that parsed them before the
    /// template writes them (mistral-common, llama-models): OpenAI's string
    /// parsed when it is JSON, else as a JSON string.
    fn parsed_text(&self, ascii: bool) -> String {
        match self {
            Args::Text(t) => python_text(t, ascii).unwrap_or_else(|| python_string(t, ascii)),
            Args::Json(raw) => python_text(raw, ascii).unwrap_or_else(|| (*raw).to_owned()),
            Args::Empty => "{}".to_owned(),
        }
    }

    /// Calls `f` with each member of the arguments (GLM and MiniMax print
    /// them one by one); false when they are not an object.
    fn for_each_member(&self, f: &mut dyn FnMut(&str, &RawValue)) -> bool {
        let raw = match self {
            Args::Text(t) => t.as_str(),
            Args::Json(raw) => raw,
            Args::Empty => return true,
        };
        let mut de = serde_json::Deserializer::from_str(raw);
        de.deserialize_map(Members(f)).is_ok() && de.end().is_ok()
    }
}

/// A value as a template prints one argument: a string verbatim, any other
/// value as `tojson`.
fn arg_value(v: &RawValue) -> String {
    let raw = v.get();
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_owned())
    } else {
        python_text(raw, false).unwrap_or_else(|| raw.to_owned())
    }
}

/// A JSON string (or object key) as text, borrowed when it has no escape.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text<'de>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// META's `tool_calls` member, the last one when a name repeats (as JSON
/// parsers read it), its name matched decoded (`tool\u005fcalls` too).
struct LastToolCalls;

impl<'de> Visitor<'de> for LastToolCalls {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut last = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if key.0 == "tool_calls" {
                last = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok(last)
    }
}

/// Each element of a JSON array, handed to a closure as it is read: no list
/// of calls is ever built.
struct Elements<'f>(&'f mut dyn FnMut(&RawValue));

impl<'de> Visitor<'de> for Elements<'_> {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while let Some(e) = seq.next_element::<&'de RawValue>()? {
            (self.0)(e);
            n += 1;
        }
        Ok(n)
    }
}

/// Each member of a JSON object, handed to a closure as it is read.
struct Members<'f>(&'f mut dyn FnMut(&str, &RawValue));

impl<'de> Visitor<'de> for Members<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let value: &'de RawValue = map.next_value()?;
            (self.0)(&key.0, value);
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct WireCall<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    function: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// A member as text: a string decoded, null as none, anything else as its
/// JSON text.
fn text_of(v: Option<&RawValue>) -> Option<String> {
    let raw = v?.get();
    match raw {
        "null" => None,
        _ if raw.starts_with('"') => serde_json::from_str(raw).ok(),
        _ => Some(raw.to_owned()),
    }
}

impl<'a> Call<'a> {
    /// A call in either shape; `None` when it is not an object of one.
    fn of(element: &'a RawValue) -> Option<Call<'a>> {
        let c: WireCall<'a> = serde_json::from_str(element.get()).ok()?;
        let function = match c.function {
            Some(f) if f.get() != "null" => {
                Some(serde_json::from_str::<WireFunction<'a>>(f.get()).ok()?)
            }
            _ => None,
        };
        let (name, arguments) = match function {
            Some(f) => (f.name.or(c.name), f.arguments.or(c.arguments).or(c.args)),
            None => (c.name, c.args.or(c.arguments)),
        };
        let args = match arguments.map(RawValue::get) {
            None | Some("null") => Args::Empty,
            Some(raw) if raw.starts_with('"') => Args::Text(serde_json::from_str(raw).ok()?),
            Some(raw) => Args::Json(raw),
        };
        Some(Call {
            id: text_of(c.id),
            name: text_of(name).unwrap_or_default(),
            args,
        })
    }
}

/// The tokens the tool calls in `meta` add to a message whose content is
/// `content`, under `encoding` rendered as `format` does.
pub fn tool_call_tokens(encoding: Encoding, format: ToolFormat, content: &str, meta: &str) -> u64 {
    // Most messages carry none: no walk for them.
    if !meta.contains("tool_calls") && !meta.contains('\\') {
        return 0;
    }
    let mut de = serde_json::Deserializer::from_str(meta);
    let Ok(Some(member)) = de.deserialize_map(LastToolCalls) else {
        return 0;
    };
    let count = |t: &str| encoding.count(t);
    if member.get() == "null" {
        return 0;
    }
    let mut render = Render::new(format, content, &count);
    let mut each = |element: &RawValue| render.element(element);
    let mut de = serde_json::Deserializer::from_str(member.get());
    match de.deserialize_seq(Elements(&mut each)) {
        Ok(_) => render.finish(),
        // Another shape: counted as its JSON text, never less than it holds.
        Err(_) => count(member.get()),
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

/// A message's calls rendered as they are read: per call for most
/// formats; MiniMax, Llama and Mistral print every call into one text,
/// kept here until the end.
struct Render<'c> {
    format: ToolFormat,
    content: &'c str,
    count: &'c dyn Fn(&str) -> u64,
    calls: usize,
    tokens: u64,
    text: String,
}

impl<'c> Render<'c> {
    fn new(format: ToolFormat, content: &'c str, count: &'c dyn Fn(&str) -> u64) -> Render<'c> {
        Render {
            format,
            content,
            count,
            calls: 0,
            tokens: 0,
            text: String::new(),
        }
    }

    fn element(&mut self, element: &RawValue) {
        let call = (self.calls < MAX_RENDERED_CALLS)
            .then(|| Call::of(element))
            .flatten();
        match call {
            Some(call) => self.call(&call),
            None => self.tokens += (self.count)(element.get()) + UNRENDERED_CALL_TOKENS,
        }
        self.calls += 1;
    }

    fn call(&mut self, c: &Call) {
        let (i, count, no_content) = (self.calls, self.count, self.content.is_empty());
        self.tokens += match self.format {
            ToolFormat::OpenAi => count(&c.name) + count(&c.args.as_sent()) + OPENAI_CALL_OVERHEAD,
            // <|start|>assistant to=functions.NAME<|channel|>commentary
            // <|constrain|>json<|message|>ARGS<|call|>: five specials, the
            // texts between them rendered (and so counted) one by one.
            ToolFormat::Harmony => {
                5 + count("assistant")
                    + count(&format!(" to=functions.{}", c.name))
                    + count("commentary")
                    + count(" ")
                    + count("json")
                    + count(&c.args.as_sent())
            }
            // `\n` before every call but a first one with no content before
            // it, then <tool_call> TEXT </tool_call> (two added tokens).
            ToolFormat::Qwen => {
                let newline = match i {
                    0 if no_content => 0,
                    0 => newline_after(self.content, count),
                    _ => count("\n"),
                };
                let text = format!(
                    "\n{{\"name\": \"{}\", \"arguments\": {}}}\n",
                    c.name,
                    c.args.as_sent()
                );
                newline + 2 + count(&text)
            }
            // <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜> once (finish),
            // three per call.
            ToolFormat::DeepSeek => 3 + count(&c.name) + count(&c.args.as_sent()),
            ToolFormat::Glm4 | ToolFormat::Glm5 => self.glm_call(i, c),
            // Section begin/end once (finish); per call three specials, the
            // id (`functions.NAME:IDX`) and ARGS.
            ToolFormat::Kimi => {
                let id =
                    c.id.clone()
                        .unwrap_or_else(|| format!("functions.{}:{i}", c.name));
                3 + count(&id) + count(&c.args.as_sent())
            }
            ToolFormat::MiniMax => {
                self.text
                    .push_str(&format!("<invoke name=\"{}\">\n", c.name));
                let text = &mut self.text;
                c.args.for_each_member(&mut |k, v| {
                    text.push_str(&format!(
                        "<parameter name=\"{k}\">{}</parameter>\n",
                        arg_value(v)
                    ));
                });
                self.text.push_str("</invoke>\n");
                0
            }
            // Meta's llama-models (ChatFormat, the JSON tool format): each
            // call `json.dumps({"type": "function", "name": …, "parameters":
            // …})` with Python's default ASCII escapes, back to back.
            ToolFormat::Llama3 => {
                self.text.push_str(&format!(
                    "{{\"type\": \"function\", \"name\": {}, \"parameters\": {}}}",
                    python_string(&c.name, true),
                    c.args.parsed_text(true)
                ));
                0
            }
            // json.dumps([{"name", "arguments", "id"}, …]), in finish.
            ToolFormat::Mistral => {
                if i > 0 {
                    self.text.push_str(", ");
                }
                self.text.push_str(&format!(
                    "{{\"name\": {}, \"arguments\": {}",
                    python_string(&c.name, false),
                    c.args.parsed_text(false)
                ));
                if let Some(id) = c.id.as_deref().filter(|id| *id != "null") {
                    self.text
                        .push_str(&format!(", \"id\": {}", python_string(id, false)));
                }
                self.text.push('}');
                0
            }
        };
    }

    /// GLM: `\n<tool_call>NAME\n`, per argument `<arg_key>K</arg_key>\n
    /// <arg_value>V</arg_value>\n`, `</tool_call>`; GLM-5 without newlines.
    fn glm_call(&self, i: usize, c: &Call) -> u64 {
        let count = self.count;
        let nl = if self.format == ToolFormat::Glm4 {
            "\n"
        } else {
            ""
        };
        let lead = match i {
            0 if !self.content.is_empty() && !nl.is_empty() => newline_after(self.content, count),
            _ => count(nl),
        };
        let mut tokens = lead + 2 + count(&format!("{}{nl}", c.name));
        let object = c.args.for_each_member(&mut |k, v| {
            tokens += 4 + count(k) + count(nl) + count(&arg_value(v)) + count(nl);
        });
        if !object {
            tokens += count(&c.args.as_sent());
        }
        tokens
    }

    /// The tokens of every call, with what a format adds once per message.
    fn finish(self) -> u64 {
        let count = self.count;
        if self.calls == 0 {
            return 0;
        }
        self.tokens
            + match self.format {
                ToolFormat::DeepSeek | ToolFormat::Kimi => 2,
                // `\n<minimax:tool_call>` TEXT `</minimax:tool_call>`.
                ToolFormat::MiniMax if !self.text.is_empty() => {
                    let lead = if self.content.is_empty() {
                        0
                    } else {
                        newline_after(self.content, count)
                    };
                    lead + 2 + count(&format!("\n{}", self.text))
                }
                ToolFormat::Llama3 => count(&self.text),
                // [TOOL_CALLS] and the list.
                ToolFormat::Mistral if !self.text.is_empty() => {
                    1 + count(&format!("[{}]", self.text))
                }
                _ => 0,
            }
    }
}

/// `raw` (a JSON text) as Python's `json.dumps(json.loads(raw),
/// ensure_ascii=ascii)` writes it, streamed (no value tree: a 4 MB object
/// of 350,000 members held 127 MB as one); `None` when it is not JSON.
pub fn python_text(raw: &str, ascii: bool) -> Option<String> {
    let mut de = serde_json::Deserializer::from_str(raw);
    let mut out = Vec::with_capacity(raw.len() + raw.len() / 4 + 2);
    {
        let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter { ascii });
        serde_transcode::transcode(&mut de, &mut ser).ok()?;
    }
    de.end().ok()?;
    String::from_utf8(out).ok()
}

/// A string as Python's `json.dumps(s, ensure_ascii=ascii)` writes it.
fn python_string(s: &str, ascii: bool) -> String {
    use serde::Serialize;
    let mut out = Vec::with_capacity(s.len() + 2);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter { ascii });
    // Writing a str into a Vec cannot fail.
    let _ = s.serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

struct PythonFormatter {
    ascii: bool,
}

/// Python's ", " before every item of an array or object but the first.
fn item_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
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
