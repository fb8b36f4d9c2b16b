//! `mlx-gen chat` through a real pseudo-terminal (rexpect) on a tiny model of the oracle matrix: turns reuse the
//! KV cache, `/reset` empties it, Ctrl-C stops an answer, Ctrl-C at the prompt and Ctrl-D leave; and without a terminal.
mod common;

use rexpect::session::{spawn_with_options, PtySession};
use rexpect::reader::Options;
use std::process::Command;

fn spawn(max_tokens: &str, extra: &[&str]) -> PtySession {
    let dir = common::model("llama3-f32");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-gen"));
    cmd.args(["chat", "--model", dir.to_str().unwrap(), "--verbose", "--max-tokens", max_tokens])
        .args(extra)
        .env("TERM", "xterm")
        .env("NO_COLOR", "1");
    spawn_with_options(cmd, Options::new().timeout_ms(Some(120_000)).strip_ansi_escape_codes(true)).expect("spawn mlx-gen chat")
}

/// Sends a message; returns (prompt tokens processed, tokens reused) from the `--verbose` line.
fn turn(p: &mut PtySession, text: &str) -> (usize, usize) {
    p.send_line(text).unwrap();
    let (_, m) = p.exp_regex(r"\[prompt: \d+ tokens processed, \d+ reused").expect("the --verbose line");
    let nums: Vec<usize> = m.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    p.exp_string(">>> ").expect("the prompt after an answer");
    (nums[0], nums[1])
}

#[test]
fn turns_reuse_the_cache_and_reset_empties_it() {
    let mut p = spawn("8", &[]);
    p.exp_string(">>> ").expect("the first prompt");
    let (first, reused) = turn(&mut p, "My name is Ada.");
    assert_eq!(reused, 0, "the first turn has nothing cached");
    let (second, reused2) = turn(&mut p, "What is my name?");
    assert!(reused2 >= first, "the second turn must reuse the first turn's prompt ({reused2} reused, first had {first})");
    assert!(second < first + reused2, "the second turn must process only new tokens ({second} processed, {reused2} reused)");
    p.send_line("/reset").unwrap();
    p.exp_string("Conversation reset.").unwrap();
    p.exp_string(">>> ").unwrap();
    let (again, reused3) = turn(&mut p, "My name is Ada.");
    assert_eq!((again, reused3), (first, 0), "after /reset the same message is processed from scratch");
    p.send_line("/nonsense").unwrap();
    p.exp_string("Unknown command /nonsense").unwrap();
    p.exp_string(">>> ").unwrap();
    p.send_control('d').unwrap();
    p.exp_eof().expect("Ctrl-D leaves");
}

#[test]
fn ctrl_c_stops_an_answer_then_leaves_at_the_prompt() {
    // The model's end tokens (eos_token_id 500 and 502) are banned, so every answer runs until Ctrl-C stops it:
    // an answer that ended by itself before the Ctrl-C arrived made this test flaky.
    let mut p = spawn("1000000", &["--logit-bias", "500=-inf,502=-inf"]);
    p.exp_string(">>> ").unwrap();
    p.send_line("Tell me a very long story.").unwrap();
    p.exp_string("story.\r\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(150));
    p.send_control('c').unwrap();
    p.exp_string("[stopped]").expect("Ctrl-C stops the answer");
    p.exp_regex(r"generation: \d+ tokens").unwrap();
    p.exp_string(">>> ").expect("back at the prompt");
    // The interrupted answer stays in the conversation and the cache stays usable.
    p.send_line("\"\"\"Go on,").unwrap();
    p.exp_string("... ").expect("a block continues");
    p.send_line("please.\"\"\"").unwrap();
    p.exp_string("please.\"\"\"\r\n").unwrap();
    p.send_control('c').unwrap();
    p.exp_string("[stopped]").unwrap();
    let (_, m) = p.exp_regex(r"\[prompt: \d+ tokens processed, \d+ reused").unwrap();
    assert!(!m.contains(", 0 reused"), "the turn after an interrupted one reuses the cache: {m}");
    p.exp_string(">>> ").unwrap();
    p.send_control('c').unwrap();
    p.exp_eof().expect("Ctrl-C at the prompt leaves");
}

#[test]
fn chat_reads_plain_lines_without_a_terminal() {
    let dir = common::model("llama3-f32");
    let save = std::env::temp_dir().join(format!("mlx-gen-chat-{}.json", std::process::id()));
    let script = format!("Hello\\\nthere\n/system Be brief.\nSecond\n/save {}\n/exit\nnever read\n", save.display());
    let out = common::mlx_gen(&["chat", "--model", dir.to_str().unwrap(), "-m", "5", "--verbose"], Some(script.as_bytes()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("[prompt: ").count(), 2, "two turns: {stderr}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&save).unwrap()).unwrap();
    let _ = std::fs::remove_file(&save);
    let msgs = saved["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(msgs[1]["content"], "Hello\nthere", "a line ending in \\ continues");
    assert_eq!(msgs[0]["content"], "Be brief.");
}

#[test]
fn chat_needs_a_chat_template() {
    let dir = common::model("llama3-f32");
    let tmp = std::env::temp_dir().join(format!("mlx-gen-chat-notemplate-{}", std::process::id()));
    common::copy_dir(&dir, &tmp);
    let cfg_path = tmp.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let _ = std::fs::remove_file(tmp.join("chat_template.jinja"));
    let out = common::mlx_gen(&["chat", "--model", tmp.to_str().unwrap()], Some(b"hi\n"));
    let _ = std::fs::remove_dir_all(&tmp);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error:") && stderr.contains("chat template") && stderr.lines().count() == 1, "{stderr}");
}

#[test]
fn max_kv_size_drops_the_oldest_turns() {
    let dir = common::model("llama3-f32");
    let script = b"Hello there my friend\nSecond message here\nThird one\n";
    let args = ["chat", "--model", dir.to_str().unwrap(), "-m", "30", "--max-kv-size", "100", "--verbose"];
    let out = common::mlx_gen(&args, Some(script));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("[prompt: ").count(), 3, "{stderr}");
    assert!(stderr.contains("dropped the 2 oldest messages"), "{stderr}");
    for line in stderr.lines().filter(|l| l.starts_with("[prompt: ")) {
        let n: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|s| s.parse().ok()).collect();
        let generated = line.split("generation: ").nth(1).unwrap().split(' ').next().unwrap().parse::<usize>().unwrap();
        assert!(n[0] + n[1] + generated <= 100, "the cache stays within --max-kv-size: {line}");
    }
}
