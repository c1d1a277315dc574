//! The command line of a `#[ruststream::app]` binary (feature `cli`),
//! tested on the built quickstart example: `run` is the default,
//! `asyncapi` writes the document (JSON or YAML, to stdout or a file),
//! `check` exits 0, or 1 with the reason, `--config FILE` is read, and
//! `--help` lists the commands.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The quickstart binary `cargo test` built beside this test.
fn quickstart() -> Command {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("quickstart");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --example quickstart`",
        path.display()
    );
    let mut command = Command::new(path);
    // No settings but the test's own.
    for (name, _) in std::env::vars() {
        if name.starts_with("RUSTSTREAM__") {
            command.env_remove(name);
        }
    }
    command
}

fn run(command: &mut Command) -> (Output, String, String) {
    let output = command.output().expect("the quickstart runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stdout, stderr)
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ruststream-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn run_is_the_default() {
    let (output, stdout, stderr) = run(&mut quickstart());
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("handled 5 orders; bye"), "{stdout}");
}

#[test]
fn asyncapi_prints_the_document_as_json() {
    let (output, stdout, stderr) = run(quickstart().arg("asyncapi"));
    assert!(output.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(doc["info"]["title"], "quickstart");
    assert_eq!(doc["operations"]["confirm"]["action"], "receive");
    assert!(doc["operations"]["confirm"]["reply"].is_object());
    assert_eq!(
        doc["components"]["schemas"]["Order"]["properties"]["qty"]["type"],
        "integer"
    );
    assert!(!stdout.contains("handled"), "the app did not run: {stdout}");
}

#[test]
fn asyncapi_writes_yaml_to_a_file() {
    let out = temp_file("asyncapi.yaml", "");
    let (output, stdout, stderr) = run(quickstart()
        .args(["asyncapi", "--format", "yaml", "--output"])
        .arg(&out));
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout, "");
    let yaml = std::fs::read_to_string(&out).unwrap();
    assert!(yaml.starts_with("asyncapi: 3.0.0"), "{yaml}");
    assert!(yaml.contains("orders.created"), "{yaml}");
}

#[test]
fn check_passes_on_valid_settings() {
    let config = temp_file(
        "ok.toml",
        "shutdown_timeout = \"5s\"\n[subscribers.confirm]\nworkers = 4\n",
    );
    let (output, stdout, stderr) = run(quickstart().arg("--config").arg(&config).arg("check"));
    assert!(output.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("check passed"), "{stdout}");
    assert!(!stdout.contains("handled"), "the app did not run: {stdout}");
}

#[test]
fn check_fails_with_the_reason_from_the_file() {
    let config = temp_file("typo.toml", "[subscribers.confirm]\nworkres = 4\n");
    let (output, _, stderr) = run(quickstart().arg("check").arg("--config").arg(&config));
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`subscribers.confirm.workres`"), "{stderr}");
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
}

#[test]
fn check_fails_with_the_reason_from_the_environment() {
    let (output, _, stderr) = run(quickstart()
        .arg("check")
        .env("RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS", "0"));
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("check failed"), "{stderr}");
    assert!(stderr.contains("workers(n) needs n >= 1"), "{stderr}");
}

#[test]
fn help_lists_the_commands() {
    let (output, stdout, _) = run(quickstart().arg("--help"));
    assert!(output.status.success());
    for word in ["run", "asyncapi", "check", "--config"] {
        assert!(stdout.contains(word), "{word} in {stdout}");
    }
}

#[test]
fn an_unknown_command_is_refused() {
    let (output, _, stderr) = run(quickstart().arg("deploy"));
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("deploy"), "{stderr}");
}
