//! Rewrites a Jinja2 chat template's source into one minijinja reads the way Jinja2 reads the original:
//! newlines normalized, string literals unescaped by Python's rules, transformers' `{% generation %}` tag.

/// The source minijinja should compile for a Jinja2 template.
pub(crate) fn prepare(src: &str) -> String {
    // Jinja2's lexer turns "\r\n" and "\r" into "\n" in template data and string literals.
    let src = src.replace("\r\n", "\n").replace('\r', "\n");
    replace_generation_tags(&rewrite_string_literals(&src))
}

/// Re-escapes the string literals inside `{{ }}` and `{% %}` so that minijinja decodes them to what
/// Python's "unicode-escape" codec (which Jinja2 uses) decodes them to: backslash-newline vanishes, and
/// `\a`, `\v`, `\U00XXXXXX` and octal escapes work.
fn rewrite_string_literals(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    loop {
        let next = ["{{", "{%", "{#"]
            .iter()
            .filter_map(|o| rest.find(o).map(|i| (i, *o)))
            .min();
        let Some((i, open)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if open == "{#" {
            let end = rest.find("#}").map_or(rest.len(), |e| e + 2);
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        let close = if open == "{{" { "}}" } else { "%}" };
        let used = rewrite_tag(rest, close, &mut out);
        let tag = &rest[..used];
        rest = &rest[used..];
        if open == "{%" && tag.trim_matches(|c: char| "{%}-+ \t\n".contains(c)) == "raw" {
            // Raw blocks are data up to their endraw tag.
            let end = find_endraw(rest).unwrap_or(rest.len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        }
    }
}

fn find_endraw(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = s[from..].find("{%") {
        let at = from + i;
        let inner = s[at + 2..].trim_start_matches(['-', '+']).trim_start();
        if inner.starts_with("endraw") {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

/// Copies one tag (from its opening to `close`) into `out`, re-escaping its string literals; returns the
/// number of bytes consumed.
fn rewrite_tag(s: &str, close: &str, out: &mut String) -> usize {
    let mut i = 2;
    let mut depth = 0usize; // open brackets: Jinja2 ends a tag only at a `}}`/`%}` outside them
    out.push_str(&s[..2]);
    while i < s.len() {
        let rest = &s[i..];
        if depth == 0 && rest.starts_with(close) {
            out.push_str(close);
            return i + close.len();
        }
        let c = rest.chars().next().unwrap_or('\0');
        match c {
            '"' | '\'' => match literal_end(rest, c) {
                Some(end) => {
                    out.push_str(&reescape(&python_unescape(&rest[1..end]), c));
                    i += end + 1;
                    continue;
                }
                None => {
                    out.push_str(rest);
                    return s.len();
                }
            },
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        out.push(c);
        i += c.len_utf8();
    }
    i.min(s.len())
}

/// The byte index of the quote closing the literal that starts at `s[0]`.
fn literal_end(s: &str, quote: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == quote {
            return Some(i);
        }
    }
    None
}

/// Python's "unicode-escape" decoding of a literal's body (`\N{...}` and bad escapes are kept as written).
fn python_unescape(body: &str) -> String {
    let chars: Vec<char> = body.chars().collect();
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    let hex = |from: usize, n: usize| -> Option<char> {
        let digits: String = chars.get(from..from + n)?.iter().collect();
        if !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        char::from_u32(u32::from_str_radix(&digits, 16).ok()?)
    };
    while i < chars.len() {
        let c = chars[i];
        if c != '\\' || i + 1 >= chars.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let d = chars[i + 1];
        let simple = match d {
            '\n' => Some(None),
            '\\' => Some(Some('\\')),
            '\'' => Some(Some('\'')),
            '"' => Some(Some('"')),
            'a' => Some(Some('\u{7}')),
            'b' => Some(Some('\u{8}')),
            'f' => Some(Some('\u{c}')),
            'n' => Some(Some('\n')),
            'r' => Some(Some('\r')),
            't' => Some(Some('\t')),
            'v' => Some(Some('\u{b}')),
            _ => None,
        };
        if let Some(ch) = simple {
            out.extend(ch);
            i += 2;
            continue;
        }
        let (len, value) = match d {
            'x' => (4, hex(i + 2, 2)),
            'u' => (6, hex(i + 2, 4)),
            'U' => (10, hex(i + 2, 8)),
            '0'..='7' => {
                let n = chars[i + 1..]
                    .iter()
                    .take(3)
                    .take_while(|c| ('0'..='7').contains(*c))
                    .count();
                let v: String = chars[i + 1..i + 1 + n].iter().collect();
                (
                    1 + n,
                    u32::from_str_radix(&v, 8).ok().and_then(char::from_u32),
                )
            }
            _ => (0, None),
        };
        match value {
            Some(v) => {
                out.push(v);
                i += len;
            }
            None => {
                out.push('\\');
                out.push(d);
                i += 2;
            }
        }
    }
    out
}

/// A minijinja string literal for `value`.
fn reescape(value: &str, quote: char) -> String {
    super::pyfmt::quoted(value, quote, |c| ((c as u32) < 0x20 || c as u32 == 0x7f).then(|| format!("\\u{:04x}", c as u32)))
}

/// Replaces transformers' `{% generation %}`/`{% endgeneration %}` (which just render their body) by an
/// always-true `if`, keeping the whitespace-control marks.
fn replace_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos + 2]);
        let tail = &rest[pos + 2..];
        match generation_tag(tail) {
            Some((replacement, used)) => {
                out.push_str(&replacement);
                rest = &tail[used..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

fn generation_tag(tail: &str) -> Option<(String, usize)> {
    let b = tail.as_bytes();
    let mut i = 0;
    let mark = |i: usize| {
        b.get(i)
            .filter(|c| **c == b'-' || **c == b'+')
            .map(|c| *c as char)
    };
    let prefix = mark(i);
    i += prefix.map_or(0, |_| 1);
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let start = i;
    while b
        .get(i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        i += 1;
    }
    let body = match &tail[start..i] {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    let suffix = mark(i);
    i += suffix.map_or(0, |_| 1);
    if !tail[i..].starts_with("%}") {
        return None;
    }
    let p = prefix.map(String::from).unwrap_or_default();
    let s = suffix.map(String::from).unwrap_or_default();
    Some((format!("{p} {body} {s}%}}"), i + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_ifs() {
        let src = "a{% generation %}b{%- endgeneration -%}c{% if x %}{% endif %}{%+generation+%}";
        assert_eq!(
            prepare(src),
            "a{% if true %}b{%- endif -%}c{% if x %}{% endif %}{%+ if true +%}"
        );
    }

    #[test]
    fn literals_unescape_as_python() {
        assert_eq!(prepare("{{ \"a\\\nb\" }}x\\\ny"), "{{ \"ab\" }}x\\\ny");
        assert_eq!(
            prepare("{% set x = 'it\\'s \\a\\v\\101\\U0001F600' %}"),
            "{% set x = 'it\\'s \\u0007\\u000bA\u{1F600}' %}"
        );
        assert_eq!(
            prepare("{# '\\\n' #}{% raw %}{{ '\\\n' }}{% endraw %}"),
            "{# '\\\n' #}{% raw %}{{ '\\\n' }}{% endraw %}"
        );
        assert_eq!(prepare("a\r\nb\rc"), "a\nb\nc");
        assert_eq!(prepare("{{ {'a': {'b': '\\x41'}} }}"), "{{ {'a': {'b': 'A'}} }}");
    }
}
