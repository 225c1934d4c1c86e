//! The evaluation corpus: scripted investigations (`src/eval/corpus/*.json`, built into
//! the binary by [`built_in`], so the worker's image runs `summarizer eval`), each a
//! history of human asks, tool calls, tool output and the agent's answers in phases,
//! with the facts each phase plants: as identifiers (`facts`) and as statements
//! (`statements`: a subject, a relation and a value, such as checkout-api / version
//! rolled out / v5.33.0), planted where an investigation states them (the agent's
//! conclusion, the human's remark, a decisive tool line), with distractors in tool
//! output (the same subject with another value, another subject with a similar one).
//! A statement's `kind` says what it records: a `finding` (the default), or the task
//! state an agent must not lose: an `action` it took with its result, a `decision`, a
//! `next_step` still open. A phase's `rules` are the user's standing rules and task in
//! their own words (`"Never restart orders-db without asking me first."`), each written
//! verbatim in one of the phase's `user` messages.
//!
//! A script is JSON. A message is one object with one of `user`, `assistant` or `tool`;
//! an assistant message's `calls` (`{name, args}`) are answered by the `tool` messages
//! right after it, in order, and get their ids here. A `tool` message's `filler` appends
//! generated lines (log and metric noise) so that a script can be hundreds of kilobytes
//! without being written out: see [`Filler`].

use std::path::Path;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::message::{Message, Role, char_count};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub name: String,
    pub domain: String,
    #[serde(default)]
    pub system: Option<String>,
    pub phases: Vec<PhaseScript>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseScript {
    pub name: String,
    /// Identifiers the investigation turns on, each written verbatim in this phase.
    pub facts: Vec<String>,
    /// The facts as statements: what each value is about. A script without them is
    /// measured by its identifiers alone.
    #[serde(default)]
    pub statements: Vec<StatementScript>,
    /// The user's standing rules and task in their own words, each written verbatim in
    /// a `user` message of this phase: what the agent must keep obeying, measured word
    /// for word.
    #[serde(default)]
    pub rules: Vec<String>,
    pub messages: Vec<Step>,
}

/// A planted fact as a statement: `subject` (or one of its `aliases`) and `value` in one
/// sentence or line of the phase, as the investigation states it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatementScript {
    pub subject: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub relation: String,
    pub value: String,
    /// What the statement records: a finding unless said otherwise.
    #[serde(default)]
    pub kind: Kind,
}

/// What a planted statement records: what the investigation found, or its task state
/// (what was done, what was decided, what comes next).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// What the investigation established ("pg-primary-1 runs with max_connections=500").
    #[default]
    Finding,
    /// What the agent did, with its result ("I rolled back checkout-api to v5.32.1 at
    /// 14:20; the 502 rate fell to 0.1%").
    Action,
    /// What was decided ("We decided to keep the replica out of rotation").
    Decision,
    /// What comes next and is not done yet ("Next: raise max_pool to 200").
    NextStep,
}

impl Kind {
    /// Every kind, in the order reports give them.
    pub const ALL: [Kind; 4] = [Kind::Finding, Kind::Action, Kind::Decision, Kind::NextStep];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Finding => "finding",
            Kind::Action => "action",
            Kind::Decision => "decision",
            Kind::NextStep => "next_step",
        }
    }

    /// Its place in [`Kind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A planted statement, ready to be looked for.
#[derive(Clone, Debug)]
pub struct Statement {
    /// The subject first, then its aliases.
    pub subjects: Vec<String>,
    pub relation: String,
    pub value: String,
    pub kind: Kind,
}

impl Statement {
    /// Whether one statement of `text` (not a list) holds this one's subject and value.
    pub fn stated_in(&self, text: &str) -> bool {
        crate::facts::states(text, &self.subjects, &self.value)
    }
}

impl std::fmt::Display for Statement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.kind != Kind::Finding {
            write!(f, "[{}] ", self.kind.as_str())?;
        }
        write!(f, "{} {}: {}", self.subjects[0], self.relation, self.value)
    }
}

impl From<StatementScript> for Statement {
    fn from(s: StatementScript) -> Self {
        let mut subjects = vec![s.subject];
        subjects.extend(s.aliases);
        Self {
            subjects,
            relation: s.relation,
            value: s.value,
            kind: s.kind,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    assistant: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    calls: Vec<Call>,
    #[serde(default)]
    filler: Option<Filler>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    name: String,
    #[serde(default)]
    args: Value,
}

/// `count` lines of `template`, one per index `i` from 0, with these placeholders:
/// `{i}`; `{hh}` `{mm}` `{ss}`, the time `start_s + i * step_s` seconds after 14:00:00;
/// `{r}`, `(i * 7919 + seed * 104729) % 1000`; `{pick:a|b|c}`, the `i % n`-th option.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filler {
    template: String,
    count: u32,
    #[serde(default)]
    start_s: u64,
    #[serde(default = "one")]
    step_s: u64,
    #[serde(default)]
    seed: u64,
}

fn one() -> u64 {
    1
}

impl Filler {
    fn line(&self, i: u64) -> String {
        let t = 14 * 3600 + self.start_s + i * self.step_s;
        let mut out = String::with_capacity(self.template.len() + 16);
        let mut rest = self.template.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let name = &rest[open + 1..open + close];
            match name {
                "i" => out.push_str(&i.to_string()),
                "hh" => out.push_str(&format!("{:02}", (t / 3600) % 24)),
                "mm" => out.push_str(&format!("{:02}", (t / 60) % 60)),
                "ss" => out.push_str(&format!("{:02}", t % 60)),
                "r" => out.push_str(&((i * 7919 + self.seed * 104_729) % 1000).to_string()),
                _ => match name.strip_prefix("pick:") {
                    Some(options) => {
                        let options: Vec<&str> = options.split('|').collect();
                        out.push_str(options[(i as usize) % options.len()]);
                    }
                    None => out.push_str(&rest[open..=open + close]),
                },
            }
            rest = &rest[open + close + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// A script played out: its messages in order, each with its phase.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub domain: String,
    pub system: Option<Message>,
    pub phases: Vec<Phase>,
    pub messages: Vec<Played>,
}

#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    pub facts: Vec<String>,
    pub statements: Vec<Statement>,
    /// The user's rules given in this phase, as written.
    pub rules: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Played {
    pub phase: usize,
    pub message: Message,
}

impl Scenario {
    pub fn chars(&self) -> i64 {
        self.messages.iter().map(|p| p.message.chars).sum()
    }

    pub fn fact_count(&self) -> usize {
        self.phases.iter().map(|p| p.facts.len()).sum()
    }

    pub fn statement_count(&self) -> usize {
        self.phases.iter().map(|p| p.statements.len()).sum()
    }

    /// The planted statements of `kind`.
    pub fn count_of(&self, kind: Kind) -> usize {
        (self.phases.iter().flat_map(|p| &p.statements))
            .filter(|s| s.kind == kind)
            .count()
    }

    pub fn rule_count(&self) -> usize {
        self.phases.iter().map(|p| p.rules.len()).sum()
    }
}

/// The corpus built into the binary, by file name.
const BUILT_IN: [(&str, &str); 6] = [
    ("bad-deploy.json", include_str!("corpus/bad-deploy.json")),
    (
        "certificate-expiry.json",
        include_str!("corpus/certificate-expiry.json"),
    ),
    (
        "database-saturation.json",
        include_str!("corpus/database-saturation.json"),
    ),
    ("memory-leak.json", include_str!("corpus/memory-leak.json")),
    (
        "network-partition.json",
        include_str!("corpus/network-partition.json"),
    ),
    (
        "security-incident.json",
        include_str!("corpus/security-incident.json"),
    ),
];

/// The corpus built into the binary, played out, sorted by name.
///
/// # Errors
/// As [`load_dir`]; a test loads it, so a release never fails here.
pub fn built_in() -> anyhow::Result<Vec<Scenario>> {
    BUILT_IN
        .iter()
        .map(|(name, text)| parse(name, text))
        .collect()
}

/// Every `*.json` script in `dir`, played out, sorted by name.
///
/// # Errors
/// A file that cannot be read or parsed, or a script that breaks the format's rules (see
/// [`Scenario::from_script`]), named with its file.
pub fn load_dir(dir: &Path) -> anyhow::Result<Vec<Scenario>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the corpus {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        bail!("the corpus {} holds no *.json script", dir.display());
    }
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            parse(&path.display().to_string(), &text)
        })
        .collect()
}

/// One script, named `name` in errors, played out.
fn parse(name: &str, text: &str) -> anyhow::Result<Scenario> {
    let script: Script = serde_json::from_str(text).with_context(|| format!("parsing {name}"))?;
    Scenario::from_script(script).with_context(|| format!("in {name}"))
}

impl Scenario {
    /// Plays `script` out into messages.
    ///
    /// # Errors
    /// A message with no role or several; calls not answered by as many tool messages
    /// right after them; a tool message that answers no call; a planted fact that is not
    /// written in its phase (filler aside); a planted statement that no sentence or line
    /// of its phase states; a rule that no user message of its phase writes verbatim.
    pub fn from_script(script: Script) -> anyhow::Result<Self> {
        let mut messages = Vec::new();
        let mut phases = Vec::new();
        let mut next_call = 0usize;
        let mut waiting: Vec<String> = Vec::new();
        let mut problems: Vec<String> = Vec::new();
        for (phase_index, phase) in script.phases.into_iter().enumerate() {
            let mut written = String::new();
            let mut said_by_user: Vec<String> = Vec::new();
            for (n, step) in phase.messages.into_iter().enumerate() {
                let at = || format!("phase {:?}, message {n}", phase.name);
                let message = match (step.user, step.assistant, step.tool) {
                    (Some(text), None, None) => {
                        expect_no_calls_pending(&waiting).with_context(at)?;
                        written.push_str(&text);
                        written.push('\n');
                        said_by_user.push(text.clone());
                        text_message(Role::User, text)
                    }
                    (None, Some(text), None) => {
                        expect_no_calls_pending(&waiting).with_context(at)?;
                        written.push_str(&text);
                        written.push('\n');
                        let calls: Vec<Value> = step
                            .calls
                            .into_iter()
                            .map(|call| {
                                next_call += 1;
                                let id = format!("call_{next_call:04}");
                                waiting.push(id.clone());
                                written.push_str(&call.args.to_string());
                                written.push('\n');
                                json!({"id": id, "name": call.name, "args": call.args, "type": "tool_call"})
                            })
                            .collect();
                        let mut m = text_message(Role::Assistant, text);
                        if !calls.is_empty() {
                            m.tool_calls = Some(Value::Array(calls));
                            m.chars += char_count(
                                &m.tool_calls
                                    .as_ref()
                                    .map(Value::to_string)
                                    .unwrap_or_default(),
                            );
                        }
                        m
                    }
                    (None, None, Some(text)) => {
                        if waiting.is_empty() {
                            bail!("{}: a tool message that answers no call", at());
                        }
                        let id = waiting.remove(0);
                        written.push_str(&text);
                        written.push('\n');
                        let mut content = text;
                        if let Some(filler) = &step.filler {
                            for i in 0..u64::from(filler.count) {
                                if !content.is_empty() && !content.ends_with('\n') {
                                    content.push('\n');
                                }
                                content.push_str(&filler.line(i));
                            }
                        }
                        let mut m = text_message(Role::Tool, content);
                        m.tool_call_id = Some(id);
                        m
                    }
                    _ => bail!(
                        "{}: a message has exactly one of user, assistant, tool",
                        at()
                    ),
                };
                messages.push(Played {
                    phase: phase_index,
                    message,
                });
            }
            let found = crate::facts::FactSet::of_text(&written);
            let not_identifiers: Vec<&str> = (phase.facts.iter())
                .filter(|f| !found.contains(f))
                .map(String::as_str)
                .collect();
            if !not_identifiers.is_empty() {
                problems.push(format!(
                    "phase {:?}: planted facts must be identifiers that `facts::extract` finds \
                     in the phase's text; these are not: {not_identifiers:?}",
                    phase.name
                ));
            }
            if let Some(missing) = phase.facts.iter().find(|f| !written.contains(f.as_str())) {
                bail!(
                    "phase {:?}: the fact {missing:?} is not written in its messages",
                    phase.name
                );
            }
            let statements: Vec<Statement> =
                phase.statements.into_iter().map(Statement::from).collect();
            for statement in &statements {
                if statement.subjects.iter().any(|s| s.trim().is_empty())
                    || statement.value.trim().is_empty()
                    || statement.relation.trim().is_empty()
                {
                    problems.push(format!(
                        "phase {:?}: a statement has an empty subject, relation or value",
                        phase.name
                    ));
                } else if !statement.stated_in(&written) {
                    problems.push(format!(
                        "phase {:?}: no sentence or line of the phase (filler aside) states \
                         {statement}",
                        phase.name
                    ));
                }
            }
            for rule in &phase.rules {
                if rule.trim().is_empty() {
                    problems.push(format!("phase {:?}: a rule is empty", phase.name));
                } else if !said_by_user.iter().any(|m| m.contains(rule.as_str())) {
                    problems.push(format!(
                        "phase {:?}: the rule {rule:?} is not written verbatim in a user \
                         message of the phase",
                        phase.name
                    ));
                }
            }
            phases.push(Phase {
                name: phase.name,
                facts: phase.facts,
                statements,
                rules: phase.rules,
            });
        }
        expect_no_calls_pending(&waiting).context("at the end")?;
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        for (seq, played) in messages.iter_mut().enumerate() {
            played.message.seq = seq as i64 + 1;
        }
        Ok(Self {
            name: script.name,
            domain: script.domain,
            system: script.system.map(|text| text_message(Role::System, text)),
            phases,
            messages,
        })
    }
}

fn expect_no_calls_pending(waiting: &[String]) -> anyhow::Result<()> {
    if waiting.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} tool call(s) not answered right after their call",
            waiting.len()
        )
    }
}

fn text_message(role: Role, content: String) -> Message {
    Message {
        seq: 0,
        role,
        chars: char_count(&content),
        content,
        tool_calls: None,
        tool_call_id: None,
        is_summary: false,
        pinned: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(json: Value) -> anyhow::Result<Scenario> {
        Scenario::from_script(serde_json::from_value(json)?)
    }

    /// A script added to `src/eval/corpus/` is built in, and the two give the same corpus.
    #[test]
    fn the_built_in_corpus_is_every_script_in_its_directory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/eval/corpus");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let names_built_in: Vec<&str> = BUILT_IN.iter().map(|(name, _)| *name).collect();
        assert_eq!(files, names_built_in);
        let names = |c: Vec<Scenario>| c.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(built_in().unwrap()), names(load_dir(&dir).unwrap()));
    }

    #[test]
    fn filler_lines_fill_every_placeholder() {
        let filler = Filler {
            template: "{hh}:{mm}:{ss} {pick:a|b} r={r} #{i} {unknown}".to_owned(),
            count: 2,
            start_s: 59,
            step_s: 1,
            seed: 1,
        };
        assert_eq!(filler.line(0), "14:00:59 a r=729 #0 {unknown}");
        assert_eq!(filler.line(1), "14:01:00 b r=648 #1 {unknown}");
    }

    #[test]
    fn calls_get_ids_and_their_results() {
        let s = script(json!({"name": "n", "domain": "d", "phases": [{"name": "p", "facts": ["pg-1"],
            "messages": [
                {"user": "look at pg-1"},
                {"assistant": "", "calls": [{"name": "logs", "args": {"q": 1}}, {"name": "sql", "args": {}}]},
                {"tool": "first", "filler": {"template": "line {i}", "count": 2}},
                {"tool": "second"},
                {"assistant": "done"}
            ]}]}))
        .unwrap();
        let ms: Vec<&Message> = s.messages.iter().map(|p| &p.message).collect();
        assert_eq!(ms[2].tool_call_id.as_deref(), Some("call_0001"));
        assert_eq!(ms[3].tool_call_id.as_deref(), Some("call_0002"));
        assert_eq!(ms[2].content, "first\nline 0\nline 1");
        assert_eq!(ms[1].tool_call_ids(), ["call_0001", "call_0002"]);
        assert_eq!(
            ms.iter().map(|m| m.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn a_broken_script_is_refused_with_the_reason() {
        let refused = |messages: Value, facts: Value| {
            script(json!({"name": "n", "domain": "d", "phases": [{"name": "p", "facts": facts, "messages": messages}]}))
                .map(|_| String::new())
                .unwrap_or_else(|e| format!("{e:#}"))
        };
        assert!(refused(json!([{"tool": "x"}]), json!([])).contains("answers no call"));
        assert!(refused(json!([{"user": "a", "tool": "b"}]), json!([])).contains("exactly one"));
        assert!(
            refused(
                json!([{"assistant": "", "calls": [{"name": "x"}]}, {"user": "a"}]),
                json!([])
            )
            .contains("not answered")
        );
        let filler_only = json!([{"assistant": "", "calls": [{"name": "x"}]},
            {"tool": "", "filler": {"template": "pg-9", "count": 1}}]);
        assert!(refused(filler_only, json!(["pg-9"])).contains("not written"));
    }

    #[test]
    fn the_corpus_has_six_domains_with_facts_and_statements_in_every_phase() {
        let corpus = built_in().unwrap();
        assert!(corpus.len() >= 6, "{} scenarios", corpus.len());
        for s in &corpus {
            assert!(s.phases.len() >= 3, "{}", s.name);
            for p in &s.phases {
                assert!(!p.facts.is_empty(), "{} {}", s.name, p.name);
                // Every planted identifier is also planted as a statement.
                for fact in &p.facts {
                    assert!(
                        p.statements.iter().any(|st| &st.value == fact),
                        "{} {}: {fact} has no statement",
                        s.name,
                        p.name
                    );
                }
            }
        }
    }

    /// Every phase records task state as an investigation does (an action with its
    /// result, a decision, an open next step), each valued by an identifier the
    /// extractor finds, and every scenario has the user's rules from its first phase.
    #[test]
    fn every_phase_plants_task_state_and_every_scenario_rules() {
        for s in built_in().unwrap() {
            assert!(
                s.phases[0].rules.iter().any(|r| !r.is_empty()),
                "{}: no rule in its first phase",
                s.name
            );
            for p in &s.phases {
                for kind in [Kind::Action, Kind::Decision, Kind::NextStep] {
                    assert!(
                        p.statements.iter().any(|st| st.kind == kind),
                        "{} {}: no {}",
                        s.name,
                        p.name,
                        kind.as_str()
                    );
                }
                let text: String = (s.messages.iter())
                    .filter(|m| s.phases[m.phase].name == p.name)
                    .map(|m| m.message.content.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                let found = crate::facts::FactSet::of_text(&text);
                for st in p.statements.iter().filter(|st| st.kind != Kind::Finding) {
                    assert!(
                        found.contains(&st.value),
                        "{} {}: {st} is not valued by an identifier",
                        s.name,
                        p.name
                    );
                }
            }
        }
    }

    #[test]
    fn a_rule_not_written_verbatim_and_an_unknown_kind_are_refused() {
        let phase = |rules: Value, kind: &str| {
            script(
                json!({"name": "n", "domain": "d", "phases": [{"name": "p", "facts": [],
                "statements": [{"subject": "checkout-api", "relation": "rolled back to",
                    "value": "v2.1.0", "kind": kind}],
                "rules": rules,
                "messages": [
                    {"user": "Never restart orders-db without asking me first. Go."},
                    {"assistant": "I rolled back checkout-api to v2.1.0."}
                ]}]}),
            )
            .map(|s| format!("{:?}", s.phases[0].statements[0].kind))
            .unwrap_or_else(|e| format!("{e:#}"))
        };
        assert_eq!(
            phase(
                json!(["Never restart orders-db without asking me first."]),
                "action"
            ),
            "Action"
        );
        let reworded = phase(
            json!(["Never restart orders-db without asking first."]),
            "action",
        );
        assert!(reworded.contains("not written verbatim"), "{reworded}");
        let unknown = phase(json!([]), "chore");
        assert!(unknown.contains("unknown variant"), "{unknown}");
    }

    /// The statements are measured against distractors: tool output holding the same
    /// subjects with other values, and similar values of other subjects.
    #[test]
    fn most_planted_statements_have_a_distractor_in_tool_output() {
        for s in built_in().unwrap() {
            let tool_lines: Vec<&str> = (s.messages.iter())
                .filter(|p| p.message.role == Role::Tool)
                .flat_map(|p| p.message.content.lines())
                .collect();
            let statements: Vec<&Statement> = s.phases.iter().flat_map(|p| &p.statements).collect();
            let distracted = statements
                .iter()
                .filter(|st| {
                    tool_lines.iter().any(|line| {
                        let subject = st
                            .subjects
                            .iter()
                            .any(|n| crate::facts::holds_name(line, n));
                        let value = crate::facts::contains_word(line, &st.value);
                        subject != value
                    })
                })
                .count();
            assert!(
                distracted * 4 >= statements.len() * 3,
                "{}: {distracted} of {} statements have a distractor",
                s.name,
                statements.len()
            );
        }
    }

    #[test]
    fn a_statement_not_stated_in_its_phase_is_refused() {
        let phase = |statements: Value| {
            script(
                json!({"name": "n", "domain": "d", "phases": [{"name": "p", "facts": ["v2.1.0"],
                "statements": statements,
                "messages": [
                    {"user": "What runs now?"},
                    {"assistant": "checkout-api was deployed. It runs v2.1.0."},
                    {"assistant": "Also noted: checkout-api, v2.1.0, 14:01"}
                ]}]}),
            )
            .map(|_| String::new())
            .unwrap_or_else(|e| format!("{e:#}"))
        };
        let apart =
            phase(json!([{"subject": "checkout-api", "relation": "version", "value": "v2.1.0"}]));
        assert!(
            apart.contains("states checkout-api version: v2.1.0"),
            "{apart}"
        );
        let aliased = phase(json!([{"subject": "checkout-api", "aliases": ["it"],
            "relation": "version", "value": "v2.1.0"}]));
        assert_eq!(aliased, "");
    }
}
