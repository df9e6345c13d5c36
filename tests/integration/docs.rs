//! The guide (`docs/`) and the README, kept true by the code: every relative link and anchor
//! resolves, every `cilium-idmig` command line in a code block parses with the CLI's own
//! parser, every flag is explained in a hand-written page, every exit code named is one the
//! binary uses, every command's `--help` ends with examples the guide shows, and the command
//! reference is written from the CLI's definitions (`UPDATE_SNAPSHOTS=1 cargo test
//! generated_docs` writes it again). The book needs mdBook to build, which this test does
//! not run: it checks what mdBook would (the SUMMARY names every page, links resolve).

// The CLI's definitions themselves, compiled into this test: the binary's parser, not a copy.
#[allow(dead_code)]
#[path = "../../src/cli/args.rs"]
mod args;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The pages written from the code; every other page is written by hand.
const GENERATED: &[&str] = &[
    "docs/src/reference/commands.md",
    "docs/src/reference/keys.md",
];

/// One Markdown file: its prose lines (outside code blocks) and its code blocks.
struct Page {
    path: PathBuf,
    rel: String,
    prose: Vec<(usize, String)>,
    blocks: Vec<Block>,
}

struct Block {
    lang: String,
    lines: Vec<(usize, String)>,
}

fn parse_page(path: &Path) -> Page {
    let text = std::fs::read_to_string(path).unwrap();
    let rel = path
        .strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (mut prose, mut blocks) = (Vec::new(), Vec::new());
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                open = Some(Block {
                    lang: line.trim_start().trim_start_matches('`').trim().to_string(),
                    lines: Vec::new(),
                })
            }
            (Some(_), true) => blocks.extend(open.take()),
            (Some(b), false) => b.lines.push((n, line.to_string())),
            (None, false) => prose.push((n, line.to_string())),
        }
    }
    assert!(open.is_none(), "{rel}: a code block is never closed");
    Page {
        path: path.to_path_buf(),
        rel,
        prose,
        blocks,
    }
}

/// The files under `dir` whose name ends in `.ext`, at any depth.
fn files_with(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_with(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// The README and every page of the guide.
fn pages() -> Vec<Page> {
    let mut files = vec![root().join("README.md")];
    files_with(&root().join("docs"), "md", &mut files);
    files.sort();
    files.iter().map(|f| parse_page(f)).collect()
}

fn hand_written(pages: &[Page]) -> impl Iterator<Item = &Page> {
    pages
        .iter()
        .filter(|p| !GENERATED.contains(&p.rel.as_str()))
}

/// A line without its inline code spans (a link inside backticks is no link).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The targets of the Markdown links and images on a line.
fn links(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let tail = &rest[i + 2..];
        let Some(end) = tail.find(')') else { break };
        out.push(tail[..end].trim().to_string());
        rest = &tail[end..];
    }
    out
}

/// The anchor GitHub and mdBook give a heading: lower case, spaces to `-`, punctuation gone.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(page: &Page) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in &page.prose {
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let s = slug(h.trim_start_matches('#'));
        let n = seen.entry(s.clone()).or_default();
        out.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn docs_links_and_anchors_resolve() {
    let pages = pages();
    let by_path: BTreeMap<PathBuf, &Page> = pages
        .iter()
        .map(|p| (p.path.canonicalize().unwrap(), p))
        .collect();
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in &pages {
        for (n, line) in &page.prose {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if file.is_empty() {
                    page.path.clone()
                } else {
                    page.path.parent().unwrap().join(file)
                };
                let Ok(dest) = dest.canonicalize() else {
                    bad.push(format!("{}:{n}: {target}: no such file", page.rel));
                    continue;
                };
                if anchor.is_empty() {
                    continue;
                }
                match by_path.get(&dest) {
                    Some(p) if anchors(p).contains(anchor) => {}
                    Some(p) => bad.push(format!(
                        "{}:{n}: {target}: {} has no heading #{anchor}",
                        page.rel, p.rel
                    )),
                    None => bad.push(format!(
                        "{}:{n}: {target}: an anchor into a file that is not Markdown",
                        page.rel
                    )),
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn docs_summary_names_every_page_of_the_book() {
    let src = root().join("docs/src");
    let summary = parse_page(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = summary
        .prose
        .iter()
        .flat_map(|(_, l)| links(l))
        .map(|l| src.join(l.split('#').next().unwrap()))
        .collect();
    let mut files = Vec::new();
    files_with(&src, "md", &mut files);
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(*f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages the book would leave out (add them to docs/src/SUMMARY.md):\n{}",
        missing.join("\n")
    );
    assert!(root().join("docs/book.toml").exists());
}

/// Shell words of a command line, up to a redirection, pipe or comment.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            '>' | '|' | ';' | '&' | '<' => break,
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    // A redirection written `2>file` leaves its `2` behind.
    if words.last().is_some_and(|w| w == "2") && line.contains("2>") {
        words.pop();
    }
    words
}

/// Every command line of the tool in the code blocks: `(where, words)`, the words starting at
/// the tool's name. `scripts/demo ARGS` runs `cilium-idmig demo ARGS`.
fn command_lines(pages: &[Page]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for page in pages {
        for block in &page.blocks {
            if !["sh", "bash", "console", "shell", ""].contains(&block.lang.as_str()) {
                continue;
            }
            let mut joined: Vec<(usize, String)> = Vec::new();
            let mut cont = false;
            for (n, line) in &block.lines {
                let text = line.trim().trim_start_matches("$ ").to_string();
                if cont {
                    let last = joined.last_mut().unwrap();
                    last.1 = format!("{} {}", last.1.trim_end_matches('\\'), text);
                } else {
                    joined.push((*n, text));
                }
                cont = line.trim_end().ends_with('\\');
            }
            for (n, line) in joined {
                let mut words = shell_words(&line);
                if words.first().is_some_and(|w| w == "sudo") {
                    words.remove(0);
                }
                if words.first().is_some_and(|w| w == "kubectl")
                    && words.get(1).is_some_and(|w| w == "cilium-idmig")
                {
                    words.remove(0);
                }
                if words.first().is_some_and(|w| w == "scripts/demo") {
                    words[0] = "demo".into();
                    words.insert(0, "cilium-idmig".into());
                }
                if words.first().is_some_and(|w| w == "cilium-idmig") {
                    out.push((format!("{}:{n}", page.rel), words));
                }
            }
        }
    }
    out
}

fn parses(words: &[String]) -> Result<(), String> {
    match args::Cli::command().try_get_matches_from(words) {
        Ok(m) => args::Cli::from_arg_matches(&m)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn docs_command_lines_parse_with_the_cli() {
    let pages = pages();
    let lines = command_lines(&pages);
    assert!(lines.len() > 40, "only {} command lines found", lines.len());
    let bad: Vec<String> = lines
        .iter()
        .filter_map(|(at, words)| {
            parses(words)
                .err()
                .map(|e| format!("{at}: {}\n{e}", words.join(" ")))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "command lines the CLI refuses:\n{}",
        bad.join("\n")
    );
    // The check can fail: a flag the CLI does not have is refused.
    assert!(
        parses(&[
            "cilium-idmig".into(),
            "plan".into(),
            "--no-such-flag".into()
        ])
        .is_err()
    );
}

/// What `cargo` can be asked for by name here: the profiles, benchmarks and examples.
fn cargo_names() -> BTreeMap<&'static str, BTreeSet<String>> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    let profiles = lines
        .iter()
        .filter_map(|l| l.strip_prefix("[profile.")?.split(['.', ']']).next())
        .chain(["dev", "release", "test", "bench"])
        .map(str::to_string)
        .collect();
    // A `[[bench]]` table's `name`, the first line after it that gives one.
    let benches = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| **l == "[[bench]]")
        .filter_map(|(i, _)| {
            lines[i + 1..]
                .iter()
                .find_map(|l| l.strip_prefix("name = \""))
                .map(|n| n.trim_end_matches('"').to_string())
        })
        .collect();
    let mut files = Vec::new();
    files_with(&root().join("examples"), "rs", &mut files);
    let examples = files
        .iter()
        .filter_map(|f| Some(f.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    BTreeMap::from([
        ("--profile", profiles),
        ("--bench", benches),
        ("--example", examples),
    ])
}

/// Every `cargo` line in a code block of the README, the guide and BENCHMARKS.md names a
/// profile, benchmark and example the crate has: one renamed fails here, not for a reader.
#[test]
fn docs_cargo_lines_name_profiles_benches_and_examples_that_exist() {
    let names = cargo_names();
    let mut pages = pages();
    pages.push(parse_page(&root().join("BENCHMARKS.md")));
    let (mut checked, mut bad) = (0, Vec::new());
    for page in &pages {
        for block in &page.blocks {
            for (n, line) in &block.lines {
                let words = shell_words(line.trim().trim_start_matches("$ "));
                let Some(cargo) = words.iter().position(|w| w == "cargo") else {
                    continue;
                };
                for pair in words[cargo..].windows(2) {
                    let Some(known) = names.get(pair[0].as_str()) else {
                        continue;
                    };
                    checked += 1;
                    if !known.contains(&pair[1]) {
                        bad.push(format!("{}:{n}: {} {}", page.rel, pair[0], pair[1]));
                    }
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} names found in cargo lines");
    assert!(
        bad.is_empty(),
        "cargo lines name what the crate does not have:\n{}",
        bad.join("\n")
    );
    // The check can fail: a profile the manifest does not define is not among them.
    assert!(names["--profile"].contains("sim"));
    assert!(!names["--profile"].contains("no-such-profile"));
    assert!(names["--bench"].contains("real") && names["--example"].contains("simulate"));
}

/// Every command (the tool itself first) with its name as typed.
fn commands() -> Vec<(String, clap::Command)> {
    let mut cli = args::Cli::command();
    cli.build();
    let mut out = vec![("cilium-idmig".to_string(), cli.clone())];
    for sub in cli.get_subcommands() {
        if sub.get_name() != "help" {
            out.push((format!("cilium-idmig {}", sub.get_name()), sub.clone()));
        }
    }
    out
}

#[test]
fn docs_explain_every_flag_in_a_hand_written_page() {
    let pages = pages();
    let text: String = hand_written(&pages)
        .flat_map(|p| {
            p.prose
                .iter()
                .chain(p.blocks.iter().flat_map(|b| b.lines.iter()))
        })
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let mut missing = BTreeSet::new();
    let mut flags = 0;
    for (name, cmd) in commands() {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || ["help", "version"].contains(&long) {
                continue;
            }
            flags += 1;
            assert!(arg.get_help().is_some(), "{name} --{long} has no help text");
            if !text.contains(&format!("--{long}")) {
                missing.insert(format!("{name} --{long}"));
            }
        }
    }
    assert!(flags > 50, "only {flags} flags found");
    assert!(
        missing.is_empty(),
        "flags no hand-written page mentions:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The exit codes the binary returns, read from `main.rs`.
fn exit_codes_used() -> BTreeSet<u32> {
    let main = std::fs::read_to_string(root().join("src/main.rs")).unwrap();
    let mut codes: BTreeSet<u32> = main
        .split("ExitCode::from(")
        .skip(1)
        .filter_map(|t| t.split(')').next()?.trim().parse().ok())
        .collect();
    if main.contains("ExitCode::SUCCESS") {
        codes.insert(0);
    }
    codes
}

/// The exit codes a text names: "exit 2", "exits 1", "exit code 2", "exit status 0", and the
/// first cell of a table row under a heading about exit codes.
fn exit_codes_named(lines: &[(usize, String)]) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    let mut exit_section = false;
    for (n, line) in lines {
        if line.starts_with('#') {
            exit_section = line.to_lowercase().contains("exit");
        }
        if exit_section && line.starts_with("| `") {
            let cell = line.trim_start_matches("| `");
            if let Some(code) = cell.split('`').next().and_then(|c| c.parse().ok()) {
                out.push((*n, code));
            }
        }
        let lower = line.to_lowercase().replace('`', "");
        let mut rest = lower.as_str();
        while let Some(i) = rest.find("exit") {
            let mut tail = &rest[i + 4..];
            for word in ["s", " code", " status", " with"] {
                tail = tail.strip_prefix(word).unwrap_or(tail);
            }
            if let Some(t) = tail.strip_prefix(' ') {
                let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
                let next = t[digits.len()..].chars().next();
                if !digits.is_empty() && next.is_none_or(|c| !c.is_alphanumeric()) {
                    out.push((*n, digits.parse().unwrap()));
                }
            }
            rest = &rest[i + 4..];
        }
    }
    out
}

#[test]
fn docs_name_only_exit_codes_the_binary_uses() {
    let used = exit_codes_used();
    assert_eq!(used, BTreeSet::from([0, 1, 2]), "main.rs changed its codes");
    let mut named = 0;
    let mut bad = Vec::new();
    for page in pages() {
        let mut lines = page.prose.clone();
        lines.extend(page.blocks.iter().flat_map(|b| b.lines.clone()));
        for (n, code) in exit_codes_named(&lines) {
            named += 1;
            if !used.contains(&code) {
                bad.push(format!("{}:{n}: exit code {code}", page.rel));
            }
        }
    }
    // And the exit status each command's help states.
    for (name, cmd) in commands() {
        let help = cmd
            .get_after_long_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let status = help.split("Exit status").nth(1).unwrap_or("");
        for line in status.lines().skip(1) {
            match line.split_whitespace().next().and_then(|c| c.parse().ok()) {
                Some(code) if used.contains(&code) => named += 1,
                _ => bad.push(format!("{name} --help: {line:?}")),
            }
        }
    }
    assert!(
        named > 20,
        "only {named} exit codes found: is the parser broken?"
    );
    assert!(
        bad.is_empty(),
        "exit codes the binary never returns:\n{}",
        bad.join("\n")
    );
    // The parser sees what it must.
    let probe = vec![(
        1,
        "it exits `3` when x; exit code 2, exits with 1".to_string(),
    )];
    assert_eq!(exit_codes_named(&probe), vec![(1, 3), (1, 2), (1, 1)]);
}

#[test]
fn every_help_ends_with_examples_that_parse_and_the_guide_shows() {
    let pages = pages();
    let shown: BTreeSet<String> = hand_written(&pages)
        .flat_map(|p| p.blocks.iter().flat_map(|b| b.lines.iter()))
        .map(|(_, l)| l.trim().to_string())
        .collect();
    let mut bad = Vec::new();
    for (name, cmd) in commands() {
        let help = cmd
            .get_after_long_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let examples: Vec<&str> = help
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("cilium-idmig"))
            .collect();
        if !help.starts_with("Examples:") || !(2..=3).contains(&examples.len()) {
            bad.push(format!("{name}: the long help ends with 2 or 3 examples"));
        }
        for ex in examples {
            if let Err(e) = parses(&shell_words(ex)) {
                bad.push(format!("{name}: {ex}: {e}"));
            }
            if !shown.contains(ex) {
                bad.push(format!("{name}: {ex}: not in a code block of the guide"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The command reference: each command's usage, flags and help, from the CLI's definitions.
fn command_reference() -> String {
    let mut out = String::from(
        "# Command reference\n\n<!-- Written from src/cli/args.rs by `UPDATE_SNAPSHOTS=1 cargo test generated_docs`; a test fails when they differ. -->\n\n\
         Every command and flag, from the definitions the binary parses with (`cilium-idmig COMMAND --help`\n\
         prints the same). The task pages say when to use which.\n",
    );
    for (name, mut cmd) in commands() {
        out.push_str(&format!("\n## {name}\n\n"));
        let about = cmd
            .get_long_about()
            .or(cmd.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        out.push_str(&format!("{}\n\n", about.replace('\n', " ")));
        let usage = cmd.render_usage().to_string();
        let usage = usage.trim_start_matches("Usage: ").replace("args ", "");
        out.push_str(&format!("```text\n{}\n```\n\n", usage.trim()));
        out.push_str("| flag | default | what it does |\n|---|---|---|\n");
        for arg in cmd.get_arguments() {
            if arg.is_hide_set() || ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            let value = arg
                .get_value_names()
                .map(|v| v.iter().map(|n| format!(" <{n}>")).collect::<String>())
                .unwrap_or_default();
            let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
            let flag = match (arg.get_short(), arg.get_long()) {
                (_, None) => format!("<{}>", arg.get_id().as_str().to_uppercase()),
                (Some(s), Some(l)) => format!("-{s}, --{l}"),
                (None, Some(l)) => format!("--{l}"),
            };
            let flag = if takes_value && arg.get_long().is_some() {
                let v = if value.is_empty() {
                    format!(" <{}>", arg.get_id().as_str().to_uppercase())
                } else {
                    value
                };
                format!("{flag}{v}")
            } else {
                flag
            };
            let default: Vec<String> = if takes_value {
                arg.get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect()
            } else {
                Vec::new()
            };
            let mut help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
                .replace('\n', " ");
            if !help.ends_with(['.', ')', ':']) {
                help.push('.');
            }
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            if !possible.is_empty() && !matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                help.push_str(&format!(" One of: {}.", possible.join(", ")));
            }
            if let Some(env) = arg.get_env() {
                help.push_str(&format!(" Also from `{}`.", env.to_string_lossy()));
            }
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                flag.replace('|', "\\|"),
                if default.is_empty() {
                    String::new()
                } else {
                    format!("`{}`", default.join(","))
                },
                help.replace('|', "\\|")
            ));
        }
        if let Some(after) = cmd.get_after_long_help() {
            out.push_str(&format!(
                "\n```text\n{}\n```\n",
                after.to_string().trim_end()
            ));
        }
    }
    out
}

#[test]
fn generated_docs_command_reference_is_the_cli() {
    let path = root().join("docs/src/reference/commands.md");
    let text = command_reference();
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == text,
        "{} differs from the CLI: run UPDATE_SNAPSHOTS=1 cargo test generated_docs",
        path.display()
    );
}

/// Words that mark a message telling the user what to do.
const ADVICE: &[&str] = &[
    "pass --",
    "grant ",
    "bind the ClusterRole",
    "check that ",
    "repair or remove",
    "choose another",
    "run sync again",
    "restart with --resume",
    "stop that one",
    "install Cilium",
    "roll those nodes",
    "restart the pods",
    "let an agent",
];

/// The string literals of a source file's code (not its tests or comments), unescaped.
fn string_literals(code: &str) -> Vec<String> {
    let code = code.split("#[cfg(test)]\nmod tests").next().unwrap_or(code);
    let mut out = Vec::new();
    for line in code.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c != '"' {
                continue;
            }
            let mut lit = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => lit.push('\n'),
                        Some(e) => lit.push(e),
                        None => {}
                    },
                    '"' => break,
                    c => lit.push(c),
                }
            }
            out.push(lit);
        }
    }
    out
}

/// The longest stretch of a message that is the same whatever it names: between its
/// `{...}` placeholders.
fn fixed_part(message: &str) -> String {
    message
        .split(['{', '}', '\n'])
        .map(|s| s.trim().trim_start_matches([':', ';', ',', ')']).trim())
        .max_by_key(|s| s.len())
        .unwrap_or("")
        .to_string()
}

#[test]
fn troubleshooting_quotes_every_message_that_says_what_to_do() {
    let page = std::fs::read_to_string(root().join("docs/src/troubleshooting.md"))
        .unwrap()
        .replace('`', "");
    let mut files = Vec::new();
    files_with(&root().join("src"), "rs", &mut files);
    let mut messages = 0;
    let mut missing = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // The simulation, the sandbox and the test-only guide print nothing to an operator,
        // nor do tests (`tests.rs` and the files of a `tests/` folder beside it); the
        // examples of the help are commands, not advice.
        if ["src/sim/", "src/sandbox/", "src/guide/", "src/cli/args.rs"]
            .iter()
            .any(|p| rel.starts_with(p))
            || rel.ends_with("tests.rs")
            || rel.contains("/tests/")
        {
            continue;
        }
        let code = std::fs::read_to_string(&f).unwrap();
        for lit in string_literals(&code) {
            if !ADVICE.iter().any(|a| lit.contains(a)) {
                continue;
            }
            messages += 1;
            let fixed = fixed_part(&lit).replace('`', "");
            if !page.contains(&fixed) {
                missing.push(format!("{rel}: {fixed:?}"));
            }
        }
    }
    assert!(
        messages > 15,
        "only {messages} messages found: is the scan broken?"
    );
    assert!(
        missing.is_empty(),
        "messages docs/src/troubleshooting.md does not quote:\n{}",
        missing.join("\n")
    );
}

/// The manifests' arguments are the CLI's: the Job's and the collect pod's parse with the
/// binary's parser (with the optional components too), and the base's roles are the ones
/// `assets/clusterrole.yaml` ships.
#[test]
fn the_manifests_of_deploy_parse_with_the_cli_and_grant_what_the_assets_grant() {
    use crate::in_cluster::{kustomized, object};
    let deploy = root().join("deploy");
    let pods = [
        (deploy.clone(), "Job", "cilium-idmig-sync"),
        (deploy.join("collect"), "Pod", "cilium-idmig-log"),
    ];
    // An overlay with both components, as a platform team would write one.
    let overlay = tempfile::tempdir().unwrap();
    let up = |p: &Path| {
        let depth = p.components().count() - 1;
        let back: PathBuf = std::iter::repeat_n("..", depth).collect();
        back.join(deploy.strip_prefix("/").unwrap())
    };
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources: [{base}]\ncomponents: [{base}/components/servicemonitor, {base}/components/reserve-in-kvstore]\n",
            base = up(overlay.path()).display()
        ),
    )
    .unwrap();
    let with_components = overlay.path().to_path_buf();
    let mut checked = 0;
    for (dir, kind, name) in
        pods.iter()
            .cloned()
            .chain([(with_components, "Job", "cilium-idmig-sync")])
    {
        let docs = kustomized(dir.to_str().unwrap());
        let spec = &object(&docs, kind, name);
        let spec = match kind {
            "Job" => &spec["spec"]["template"]["spec"],
            _ => &spec["spec"],
        };
        let mut words = vec!["cilium-idmig".to_string()];
        words.extend(
            spec["containers"][0]["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        parses(&words).unwrap_or_else(|e| panic!("{kind} {name} in {}: {e}", dir.display()));
        checked += 1;
    }
    assert_eq!(checked, 3);
    let overlaid = kustomized(overlay.path().to_str().unwrap());
    assert!(overlaid.iter().any(|d| d["kind"] == "ServiceMonitor"));
    let args = object(&overlaid, "Job", "cilium-idmig-sync").to_string();
    assert!(args.contains("--reserve-in-kvstore"), "{args}");

    let shipped: Vec<serde_json::Value> =
        std::fs::read_to_string(root().join("assets/clusterrole.yaml"))
            .unwrap()
            .split("\n---\n")
            .map(|d| serde_yaml_ng::from_str(d).unwrap())
            .collect();
    let docs = kustomized(deploy.to_str().unwrap());
    for role in &shipped {
        let (kind, name) = (
            role["kind"].as_str().unwrap(),
            role["metadata"]["name"].as_str().unwrap(),
        );
        assert_eq!(
            object(&docs, kind, name)["rules"],
            role["rules"],
            "{kind} {name}"
        );
    }
}
