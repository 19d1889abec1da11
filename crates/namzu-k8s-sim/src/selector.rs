//! Label selectors as the API server reads `?labelSelector=`: equality
//! (`k=v`, `k==v`, `k!=v`), sets (`k in (a,b)`, `k notin (a,b)`) and
//! existence (`k`, `!k`), all of which must hold.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(Vec<Req>);

impl Selector {
    /// Parses `text`; `Err` names what could not be read (the API server
    /// answers 400).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        let mut depth = 0usize;
        let mut start = 0usize;
        let mut parts = Vec::new();
        for (i, ch) in text.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    parts.push(&text[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&text[start..]);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| format!("{part:?}: a set must be in parentheses"))?;
                Ok(inner
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .filter(|v| !v.is_empty())
                    .collect())
            };
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(rest)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Req::Absent(k.trim().into())
            } else if part.contains([' ', '(', ')']) {
                return Err(format!("{part:?} is not a requirement"));
            } else {
                Req::Exists(part.into())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::Ne(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Req::Exists(k) => labels.contains_key(k),
            Req::Absent(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_matches_as_the_api_server_does() {
        let l: BTreeMap<String, String> = [("app", "a"), ("tier", "task"), ("io.namzu/sandbox", "sb-1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for (sel, want) in [
            ("app=a", true),
            ("app==a", true),
            ("app!=a", false),
            ("app=b", false),
            ("tier in (task, web)", true),
            ("tier notin (task)", false),
            ("missing notin (x)", true),
            ("io.namzu/sandbox", true),
            ("!io.namzu/sandbox", false),
            ("!missing", true),
            ("app=a,tier in (task,web),!missing", true),
            ("app=a,tier=web", false),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).map(|s| s.matches(&l)), Ok(want), "{sel}");
        }
        assert!(Selector::parse("tier in task").is_err());
        assert!(Selector::parse("a b").is_err());
    }
}
