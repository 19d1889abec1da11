//! The egress flags and `namzu network` on a real network (the netns lab of
//! `namzu_conformance::netlab`): a policy set at create, shown, replaced
//! live; bad entries refused with one line naming them. Needs root,
//! iproute2, curl and openssl; reported ignored without them unless
//! `NAMZU_REQUIRE_NET=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{namzu, stderr_lines};
use namzu_conformance::netlab::{NetLab, PUB1};

/// curl's HTTP code for `url` from inside sandbox `id`.
fn code(st: &std::path::Path, id: &str, url: &str) -> String {
    let o = namzu(
        st,
        &[
            "exec",
            id,
            "--",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-m",
            "10",
            url,
        ],
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn policy_is_set_at_create_shown_and_replaced_live(st: &std::path::Path) {
    let host = format!("allowed.test={PUB1}");
    let o = namzu(
        st,
        &[
            "create",
            "--allow-host",
            ".allowed.test",
            "--egress-host",
            &host,
            "--egress-host",
            &format!("other.test={PUB1}"),
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert_eq!(code(st, &id, "http://allowed.test/"), "200");
    assert_eq!(code(st, &id, "http://other.test/"), "403");
    let show = namzu(st, &["network", &id, "show"]);
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["policy"]["kind"], "allowlist", "{v}");
    assert_eq!(v["hosts"]["allowed.test"][0], PUB1, "{v}");
    let set = namzu(st, &["network", &id, "set", "--allow-host", "other.test=80"]);
    assert!(set.status.success(), "{set:?}");
    assert_eq!(code(st, &id, "http://allowed.test/"), "403");
    assert_eq!(code(st, &id, "http://other.test/"), "200");
    let set = namzu(st, &["network", &id, "set", "--network", "deny"]);
    assert!(set.status.success(), "{set:?}");
    assert_eq!(code(st, &id, "http://other.test/"), "403");
    let show = namzu(st, &["network", &id, "show"]);
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["policy"]["kind"], "deny-all", "{v}");
    assert_eq!(v["open_connections"], 0, "{v}");
    assert!(namzu(st, &["rm", &id]).status.success());
}

fn bad_entries_are_refused_with_one_line_naming_them(st: &std::path::Path) {
    for (args, names) in [
        (vec!["--allow-host", ".com"], vec![".com", "public suffix"]),
        (
            vec!["--allow-host", "https://api.example.com"],
            vec!["https://api.example.com", "URL"],
        ),
        (
            vec!["--allow-host", "api.example.com:443"],
            vec!["api.example.com:443", "port"],
        ),
        (vec!["--allow-host", "*.example.com"], vec!["*.example.com", "glob"]),
        (vec!["--allow-host", "10.0.0.1"], vec!["10.0.0.1", "IP address"]),
        (vec!["--allow-host", "api.example.com=99999"], vec!["99999"]),
        (
            vec!["--network", "public", "--except-cidr", "nope"],
            vec!["nope", "CIDR"],
        ),
        (
            vec!["--network", "deny", "--allow-host", "a.example.com"],
            vec!["--allow-host"],
        ),
    ] {
        let mut argv = vec!["run"];
        argv.extend(args.iter().copied());
        argv.extend(["--", "true"]);
        let o = namzu(st, &argv);
        let lines = stderr_lines(&o);
        assert!(!o.status.success() && lines.len() == 1, "{args:?}: {lines:?}");
        for n in names {
            assert!(lines[0].contains(n), "{args:?}: {lines:?} should name {n}");
        }
    }
    // Nothing was created on the way.
    let ls = namzu(st, &["ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout).lines().all(|l| !l.contains("sb-")),
        "{ls:?}"
    );
}

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let lab = NetLab::start();
    if let Err(why) = &lab {
        if std::env::var_os("NAMZU_REQUIRE_NET").is_some() {
            eprintln!("egress_cli: {why}");
            return std::process::ExitCode::FAILURE;
        }
    }
    // One state directory per test: the second counts what is left.
    let st = tempfile::tempdir().unwrap();
    type Test = fn(&std::path::Path);
    let tests: Vec<(&str, Test)> = vec![
        (
            "policy_is_set_at_create_shown_and_replaced_live",
            policy_is_set_at_create_shown_and_replaced_live,
        ),
        (
            "bad_entries_are_refused_with_one_line_naming_them",
            bad_entries_are_refused_with_one_line_naming_them,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let p = st.path().join(name);
            let t = libtest_mimic::Trial::test(name, move || {
                f(&p);
                Ok(())
            });
            match &lab {
                Err(why) => t.with_ignored_flag(true).with_kind(format!("unavailable: {why}")),
                Ok(_) => t,
            }
        })
        .collect();
    let code = libtest_mimic::run(&args, trials).exit_code();
    drop(lab);
    code
}
