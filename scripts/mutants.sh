#!/usr/bin/env bash
# Mutation testing of the trust-critical code (maintenance, not CI's
# critical path): the egress decision (addr.rs, policy.rs), the agent's path
# jail, the link's preface parser and the privilege probe. Every surviving
# mutant is either killed by a test or explained in docs/mutants.md.
#
#   scripts/mutants.sh [extra cargo-mutants args]
#
# Installs cargo-mutants (pinned) when missing. Unit tests only (`--lib`):
# they are what each of these files is proven by, and a mutant build then
# takes seconds, not a sandbox suite's minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
MUTANTS_VERSION=27.1.0
if ! cargo mutants --version 2>/dev/null | grep -q "$MUTANTS_VERSION"; then
  cargo install cargo-mutants --version "$MUTANTS_VERSION" --locked
fi
exec cargo mutants \
  -f crates/namzu-core/src/egress/addr.rs \
  -f crates/namzu-core/src/egress/policy.rs \
  -f crates/namzu-agent/src/jail.rs \
  -f crates/namzu-proto/src/preface.rs \
  -f crates/namzu-core/src/check.rs \
  --re 'egress/|jail\.rs|preface\.rs|check\.rs:.*(unprivileged|privilege_probe)' \
  --timeout 60 \
  --output "${MUTANTS_OUT:-target/mutants}" \
  "$@" -- --lib
