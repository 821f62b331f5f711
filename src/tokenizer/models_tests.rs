use super::*;

fn enc(model: &str) -> Option<Encoding> {
    resolve_in(&[], model).encoding
}

fn window(model: &str) -> Option<u64> {
    resolve_in(&[], model).window
}

#[test]
fn openai_models_map_to_the_spec_encodings() {
    for m in [
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-5",
        "gpt-5.4-mini",
        "o1",
        "o3-mini",
        "o4-mini",
        "o4",
        "gpt-oss-120b",
        "ft:gpt-4o-mini:acme::x1",
    ] {
        assert_eq!(enc(m), Some(O200kBase), "{m}");
    }
    for m in [
        "gpt-4",
        "gpt-4-turbo-2024-04-09",
        "gpt-4-0613",
        "gpt-3.5-turbo",
        "gpt-3.5",
        "text-embedding-3-small",
    ] {
        assert_eq!(enc(m), Some(Cl100kBase), "{m}");
    }
}

#[test]
fn open_weight_families_map_to_their_own_encodings() {
    let cases = [
        ("deepseek-chat", DeepseekV3),
        ("deepseek-reasoner", DeepseekV3),
        ("deepseek-v3", DeepseekV3),
        ("deepseek-v4-flash", DeepseekV3),
        ("deepseek-ai/DeepSeek-V3", DeepseekV3),
        ("qwen-plus", Qwen2),
        ("qwen-max", Qwen2),
        ("qwen2.5-72b-instruct", Qwen2),
        ("Qwen/Qwen3-235B-A22B", Qwen2),
        ("qwq-32b", Qwen2),
        ("glm-4", Glm4),
        ("glm-4.5-air", Glm4),
        ("glm-4.7", Glm4),
        ("glm-5", Glm5),
        ("glm-5.2", Glm5),
        ("kimi-k2", KimiK2),
        ("kimi-k2-0905-preview", KimiK2),
        ("kimi-k3", KimiK2),
        ("MiniMax-M2", MinimaxM2),
        ("minimax-m2.5", MinimaxM2),
        ("llama-3.1-70b", Llama3),
        ("meta-llama/Llama-3.3-70B-Instruct", Llama3),
        ("llama3.2", Llama3),
        ("mistral-large", Tekken),
        ("mistral-large-latest", Tekken),
        ("mistral-nemo", Tekken),
        ("codestral-latest", Tekken),
    ];
    for (m, e) in cases {
        assert_eq!(enc(m), Some(e), "{m}");
    }
}

#[test]
fn vendors_without_a_public_tokenizer_and_unknown_models_use_the_default() {
    for m in [
        "claude-3-5-sonnet",
        "claude-opus-4-5",
        "gemini-2.5-pro",
        "llama-4-scout",
        "mixtral-8x7b",
        "moonshot-v1-8k",
        "no-such-model",
        "",
    ] {
        assert_eq!(enc(m), None, "{m}");
        assert_eq!(encoding_for_model(m, Cl100kBase), Cl100kBase);
    }
}

#[test]
fn context_windows_of_current_models() {
    let cases = [
        ("gpt-4o", 128_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4-turbo", 128_000),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-4", 8_192),
        ("gpt-4-32k", 32_768),
        ("gpt-5", 400_000),
        ("o3", 200_000),
        ("claude-3-5-sonnet", 200_000),
        ("claude-sonnet-4-6", 1_000_000),
        ("claude-2.0", 100_000),
        ("gemini-1.5-pro", 2_097_152),
        ("gemini-2.5-flash", 1_048_576),
        ("deepseek-chat", 128_000),
        ("deepseek-v4-pro", 1_000_000),
        ("qwen-plus", 131_072),
        ("qwen-max", 32_768),
        ("qwen3-max", 262_144),
        ("glm-4", 128_000),
        ("glm-4.5", 131_072),
        ("kimi-k2", 262_144),
        ("kimi-k2-0711-preview", 131_072),
        ("minimax-m2", 204_800),
        ("llama-3.1-70b", 131_072),
        ("llama-3-8b", 8_192),
        ("mistral-large", 131_072),
        ("codestral", 256_000),
    ];
    for (m, w) in cases {
        assert_eq!(window(m), Some(w), "{m}");
    }
    assert_eq!(window("no-such-model"), None);
}

#[test]
fn exact_names_beat_prefixes_and_longer_prefixes_beat_shorter() {
    assert_eq!(window("o1-mini"), Some(128_000));
    assert_eq!(window("o1"), Some(200_000));
    assert_eq!(window("gemini-pro"), Some(32_760));
    assert_eq!(
        window("gemini-pro-vision-x"),
        Some(1_048_576),
        "gemini-pro is exact; gemini* applies"
    );
    assert_eq!(
        resolve_in(&[], "GPT-4O").encoding,
        Some(O200kBase),
        "case-insensitive"
    );
    assert_eq!(
        resolve_in(&[], "gpt-4-turbo").entry,
        Some(("gpt-4-turbo*".to_owned(), false))
    );
}

#[test]
fn operator_entries_win_and_are_parsed_strictly() {
    let ops = parse(
        "my-llm=qwen2:32768, gpt-4o*=default:0 acme-*=tekken:1000\tclaude-opus-9=DEFAULT:2000000",
    )
    .unwrap();
    assert_eq!(ops.len(), 4);
    let r = resolve_in(&ops, "my-llm");
    assert_eq!(
        (r.encoding, r.window, r.entry),
        (Some(Qwen2), Some(32_768), Some(("my-llm".to_owned(), true)))
    );
    assert_eq!(
        resolve_in(&ops, "my-llm-2").encoding,
        None,
        "exact entries match only their name"
    );
    let r = resolve_in(&ops, "gpt-4o-mini");
    assert_eq!(
        (r.encoding, r.window),
        (None, None),
        "the operator's entry replaces the built-in one"
    );
    assert_eq!(resolve_in(&ops, "acme-7b").encoding, Some(Tekken));
    assert_eq!(resolve_in(&ops, "claude-opus-9").window, Some(2_000_000));
    assert_eq!(
        resolve_in(&ops, "gpt-4").encoding,
        Some(Cl100kBase),
        "built-in entries still apply"
    );
    for bad in [
        "x",
        "x=qwen2",
        "x=nope:1",
        "x=qwen2:-1",
        "x=qwen2:abc",
        "=qwen2:1",
        "a*b=qwen2:1",
        "x=qwen2:1 x=glm4:2",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    assert_eq!(parse("").unwrap(), vec![]);
    assert_eq!(parse("  , ").unwrap(), vec![]);
    let long = format!("{}=qwen2:1", "m".repeat(257));
    assert!(parse(&long).is_err());
    let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("m{i}=qwen2:1")).collect();
    assert!(parse(&many.join(" ")).is_err());
}

#[test]
fn operator_text_round_trips() {
    let ops = parse("my-llm=qwen2:32768 acme-*=default:0").unwrap();
    let text = ops
        .iter()
        .map(|e| {
            format!(
                "{}={}:{}",
                e.pattern(),
                e.encoding.map_or("default", Encoding::name),
                e.window.unwrap_or(0)
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(text, "my-llm=qwen2:32768 acme-*=default:0");
    assert_eq!(parse(&text).unwrap(), ops);
}

#[test]
fn every_built_in_entry_is_reachable_and_unique() {
    let table = built_in();
    for (i, e) in table.iter().enumerate() {
        assert!(
            table
                .iter()
                .skip(i + 1)
                .all(|o| o.name != e.name || o.prefix != e.prefix),
            "{} twice",
            e.pattern()
        );
        let r = resolve_in(&[], &e.name);
        assert_eq!(
            r.entry.map(|(p, _)| p),
            Some(e.pattern()),
            "{} is shadowed",
            e.pattern()
        );
    }
}
