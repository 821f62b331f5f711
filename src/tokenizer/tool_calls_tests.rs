use serde_json::{json, Value};

use super::*;

const ALL_FORMATS: [(ToolFormat, Encoding); 10] = [
    (ToolFormat::OpenAi, Encoding::O200kBase),
    (ToolFormat::Harmony, Encoding::O200kBase),
    (ToolFormat::Qwen, Encoding::Qwen2),
    (ToolFormat::DeepSeek, Encoding::DeepseekV3),
    (ToolFormat::Glm4, Encoding::Glm4),
    (ToolFormat::Glm5, Encoding::Glm5),
    (ToolFormat::Kimi, Encoding::KimiK2),
    (ToolFormat::MiniMax, Encoding::MinimaxM2),
    (ToolFormat::Llama3, Encoding::Llama3),
    (ToolFormat::Mistral, Encoding::Tekken),
];

fn openai_meta(calls: &[(&str, &str)]) -> String {
    let calls: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    json!({ "tool_calls": calls }).to_string()
}

fn langchain_meta(calls: &[(&str, Value)]) -> String {
    let calls: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| json!({"id": format!("call_{i}"), "name": name, "args": args, "type": "tool_call"}))
        .collect();
    json!({ "lc_type": "ai", "tool_calls": calls }).to_string()
}

#[test]
fn python_text_writes_as_json_dumps_does() {
    // json.dumps({"b": 1, "a": [1.5, True, None], "é": "x\n\"y\u0001"}, ensure_ascii=False)
    let v = r#"{"b":1,"a":[1.5,true,null],"é":"x\n\"y\u0001"}"#;
    assert_eq!(
        python_text(v, false).unwrap(),
        r#"{"b": 1, "a": [1.5, true, null], "é": "x\n\"y\u0001"}"#
    );
    assert_eq!(python_text("{}", false).unwrap(), "{}");
    assert_eq!(python_text(" [ ] ", false).unwrap(), "[]");
    assert_eq!(python_text("{", false), None);
}

#[test]
fn a_meta_without_tool_calls_adds_nothing() {
    for (format, encoding) in ALL_FORMATS {
        for meta in [
            r#"{}"#,
            r#"{"lc_type":"human"}"#,
            r#"{"tool_calls":[]}"#,
            r#"{"tool_calls":null}"#,
        ] {
            assert_eq!(
                tool_call_tokens(encoding, format, "", meta),
                0,
                "{format:?} {meta}"
            );
        }
    }
}

#[test]
fn openai_hosted_models_count_name_arguments_and_the_overhead_per_call() {
    let e = Encoding::O200kBase;
    let args = r#"{"city": "Paris", "unit": "celsius"}"#;
    let one = openai_meta(&[("get_weather", args)]);
    let per_call = e.count("get_weather") + e.count(args) + OPENAI_CALL_OVERHEAD;
    assert_eq!(tool_call_tokens(e, ToolFormat::OpenAi, "", &one), per_call);
    let two = openai_meta(&[("get_weather", args), ("get_weather", args)]);
    assert_eq!(
        tool_call_tokens(e, ToolFormat::OpenAi, "", &two),
        2 * per_call
    );
}

#[test]
fn langchain_args_count_as_langchain_openai_sends_them() {
    // langchain_openai sends json.dumps(args, ensure_ascii=False): the same
    // call in both shapes counts the same.
    let lc = langchain_meta(&[("get_weather", json!({"city": "Paris", "unit": "°C"}))]);
    let oa = openai_meta(&[("get_weather", r#"{"city": "Paris", "unit": "°C"}"#)]);
    for (format, encoding) in ALL_FORMATS {
        assert_eq!(
            tool_call_tokens(encoding, format, "", &lc),
            tool_call_tokens(encoding, format, "", &oa),
            "{format:?}"
        );
    }
}

#[test]
fn large_arguments_count_at_least_their_own_tokens_in_every_format() {
    let big = "lorem ipsum dolor sit amet, ".repeat(400);
    let args = json!({"path": "/tmp/x", "text": big});
    let text = python_text(&args.to_string(), false).unwrap();
    let meta = langchain_meta(&[("write_file", args.clone()), ("write_file", args)]);
    for (format, encoding) in ALL_FORMATS {
        let got = tool_call_tokens(encoding, format, "", &meta);
        let floor = 2 * encoding.count(&big);
        assert!(got >= floor, "{format:?}: {got} < {floor}");
        assert!(got <= 2 * encoding.count(&text) + 200, "{format:?}: {got}");
    }
}

#[test]
fn a_tool_calls_member_of_another_shape_counts_as_its_text() {
    let e = Encoding::O200kBase;
    let meta = r#"{"tool_calls":"get_weather(city='Paris')"}"#;
    let raw = r#""get_weather(city='Paris')""#;
    assert_eq!(
        tool_call_tokens(e, ToolFormat::OpenAi, "", meta),
        e.count(raw)
    );
}

#[test]
fn qwen_puts_a_newline_before_every_call_but_a_first_one_without_content() {
    let e = Encoding::Qwen2;
    let meta = openai_meta(&[("f", "{}")]);
    let bare = tool_call_tokens(e, ToolFormat::Qwen, "", &meta);
    assert_eq!(
        tool_call_tokens(e, ToolFormat::Qwen, "hi", &meta),
        bare + e.count("\n")
    );
    let text = "\n{\"name\": \"f\", \"arguments\": {}}\n";
    assert_eq!(bare, 2 + e.count(text));
}

#[test]
fn glm_counts_each_argument_between_its_special_tokens() {
    let meta = langchain_meta(&[("f", json!({"a": "x", "b": 2}))]);
    let e = Encoding::Glm5;
    let expected =
        2 + e.count("f") + (4 + e.count("a") + e.count("x")) + (4 + e.count("b") + e.count("2"));
    assert_eq!(tool_call_tokens(e, ToolFormat::Glm5, "", &meta), expected);
}

#[test]
fn kimi_counts_the_call_id_where_it_prints_the_name() {
    let e = Encoding::KimiK2;
    let meta = r#"{"tool_calls":[{"name":"f","args":{}}]}"#;
    let expected = 2 + 3 + e.count("functions.f:0") + e.count("{}");
    assert_eq!(tool_call_tokens(e, ToolFormat::Kimi, "", meta), expected);
}

#[test]
fn the_format_follows_the_model() {
    assert_eq!(
        ToolFormat::of("gpt-oss-120b", Encoding::O200kBase),
        ToolFormat::Harmony
    );
    assert_eq!(
        ToolFormat::of("gpt-4o", Encoding::O200kBase),
        ToolFormat::OpenAi
    );
    assert_eq!(
        ToolFormat::of("claude-sonnet-4-5", Encoding::O200kBase),
        ToolFormat::OpenAi
    );
    assert_eq!(
        ToolFormat::of("qwen3-32b", Encoding::Qwen2),
        ToolFormat::Qwen
    );
}

#[test]
fn floats_are_written_as_python_repr_writes_them() {
    for (text, python) in [
        ("47.408899999999996", "47.408899999999996"),
        ("9.38595867742349e-05", "9.38595867742349e-05"),
        ("1e-05", "1e-05"),
        ("0.0001", "0.0001"),
        ("1e16", "1e+16"),
        ("1.5e+20", "1.5e+20"),
        ("123.0", "123.0"),
        ("1234567890123456.0", "1234567890123456.0"),
        ("-0.0", "-0.0"),
        ("0.5", "0.5"),
        ("1E400", ""),
    ] {
        match python_text(text, false) {
            Some(v) => assert_eq!(v, python, "{text}"),
            None => assert_eq!(python, "", "{text} is out of range for JSON here"),
        }
    }
}

#[test]
fn ascii_json_escapes_as_python_does() {
    // json.dumps({"t": "é🎉"}) == '{"t": "\\u00e9\\ud83c\\udf89"}'
    assert_eq!(
        python_text(r#"{"t": "é🎉"}"#, true).unwrap(),
        r#"{"t": "\u00e9\ud83c\udf89"}"#
    );
}

#[test]
fn a_newline_after_content_is_counted_with_its_tail() {
    let e = Encoding::Qwen2;
    let meta = openai_meta(&[("f", "{}")]);
    let bare = tool_call_tokens(e, ToolFormat::Qwen, "", &meta);
    for content in [
        "Let me check.",
        "Checking:",
        "Sure ",
        "ok\n",
        "好的。",
        "Sure",
    ] {
        let joined = e.count(&format!("{content}\n")) - e.count(content);
        assert_eq!(
            tool_call_tokens(e, ToolFormat::Qwen, content, &meta),
            bare + joined,
            "{content:?}"
        );
    }
}

#[test]
fn a_repeated_or_escaped_tool_calls_name_is_read_as_json_parsers_read_it() {
    let e = Encoding::O200kBase;
    let calls = r#"[{"name":"f","args":{"q":"weather in Paris"}}]"#;
    let plain = tool_call_tokens(
        e,
        ToolFormat::OpenAi,
        "",
        &format!(r#"{{"tool_calls":{calls}}}"#),
    );
    assert!(plain > 5);
    for meta in [
        format!(r#"{{"tool\u005fcalls":{calls}}}"#),
        format!(r#"{{"tool_calls":null,"tool_calls":{calls}}}"#),
    ] {
        assert_eq!(
            tool_call_tokens(e, ToolFormat::OpenAi, "", &meta),
            plain,
            "{meta}"
        );
    }
}

#[test]
fn calls_past_the_rendered_bound_count_their_text_and_more() {
    let e = Encoding::O200kBase;
    let n = MAX_RENDERED_CALLS + 10;
    let meta = format!(r#"{{"tool_calls":[{}]}}"#, vec!["{}"; n].join(","));
    let each = e.count("{}") + OPENAI_CALL_OVERHEAD;
    let past = e.count("{}") + UNRENDERED_CALL_TOKENS;
    assert_eq!(
        tool_call_tokens(e, ToolFormat::OpenAi, "", &meta),
        MAX_RENDERED_CALLS as u64 * each + 10 * past
    );
    // An element that is not a call counts as its text too.
    let meta = r#"{"tool_calls":[{"name":"f","args":{}}, 42]}"#;
    assert_eq!(
        tool_call_tokens(e, ToolFormat::OpenAi, "", meta),
        e.count("f")
            + e.count("{}")
            + OPENAI_CALL_OVERHEAD
            + e.count("42")
            + UNRENDERED_CALL_TOKENS
    );
}
