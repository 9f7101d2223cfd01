//! Authentication on the main port: client certificates, static bearer tokens, TokenReview webhook
//! (cluster mode, [`super::webhook`]) and (optionally) anonymous.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use axum::http::HeaderValue;
use ring::digest;
use tracing::{error, warn};

use super::webhook::TokenReviewer;

/// An authenticated user, as the API server's `user.Info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserInfo {
    /// User name (a client certificate's CN, or the token file's second column).
    pub(crate) name: String,
    /// User id (the token file's third column; empty for certificates and anonymous).
    pub(crate) uid: String,
    /// Groups (a client certificate's O values, or the token file's fourth column).
    pub(crate) groups: Vec<String>,
    /// Extra attributes (only a TokenReview gives them).
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The user of requests without credentials when anonymous access is enabled.
    pub(crate) fn anonymous() -> Self {
        Self {
            name: "system:anonymous".to_owned(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".to_owned()],
            extra: BTreeMap::new(),
        }
    }
}

/// Why the token file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The file could not be read.
    #[error("cannot read the token file {}: {source}", path.display())]
    ReadTokenFile {
        /// The token file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A record is malformed.
    #[error("token file {}, line {line}: {reason}", path.display())]
    TokenFileSyntax {
        /// The token file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// What the TLS layer learnt from the connection's client certificate (already verified against the
/// client CA bundle by the handshake).
#[derive(Debug, Clone)]
pub(crate) enum ClientCert {
    /// No client certificate was presented.
    None,
    /// A verified certificate naming this user.
    User(UserInfo),
    /// A verified certificate that names no user (why).
    Unusable(String),
}

/// The user a verified client certificate names: CN is the user, each O a group (the API server's
/// `CommonNameUserConversion`).
pub(crate) fn user_from_certificate(der: &[u8]) -> ClientCert {
    let cert = match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => cert,
        Err(error) => return ClientCert::Unusable(format!("cannot parse the client certificate: {error}")),
    };
    let subject = cert.subject();
    let name = subject.iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default();
    if name.is_empty() {
        return ClientCert::Unusable("the client certificate's subject has no common name".to_owned());
    }
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok()).map(str::to_owned).collect();
    ClientCert::User(UserInfo { name: name.to_owned(), uid: String::new(), groups, extra: BTreeMap::new() })
}

/// Static bearer tokens from a CSV file in the API server's `--token-auth-file` format:
/// `token,user,uid[,"group1,group2"]`, one record a line. Blank lines are skipped, records with an empty
/// token are skipped with a warning, a repeated token replaces the earlier one (with a warning).
///
/// Tokens are kept as SHA-256 digests, so a lookup's timing tells nothing about the stored tokens.
pub(crate) struct TokenAuthenticator {
    by_digest: HashMap<[u8; 32], UserInfo>,
}

impl std::fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuthenticator").field("tokens", &self.by_digest.len()).finish()
    }
}

/// The SHA-256 of a token (what the token file and the TokenReview cache keep instead of the token).
pub(crate) fn token_digest(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, token.as_bytes()).as_ref());
    out
}

impl TokenAuthenticator {
    /// Reads and parses a token file.
    pub(crate) fn from_file(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| AuthError::ReadTokenFile { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Parses the text of a token file; `path` is only used in messages.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Self, AuthError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut by_digest = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line_no = index + 1;
            let syntax =
                |reason: String| AuthError::TokenFileSyntax { path: path.to_owned(), line: line_no, reason };
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() {
                continue;
            }
            let fields = split_csv_record(line).map_err(|e| syntax(e.to_string()))?;
            if fields.len() < 3 {
                return Err(syntax(format!(
                    "expected at least 3 columns (token,user,uid), found {}",
                    fields.len()
                )));
            }
            if fields[0].is_empty() {
                warn!(path = %path.display(), line = line_no, "empty token in the token file; record skipped");
                continue;
            }
            let groups = fields
                .get(3)
                .map(|g| g.split(',').filter(|g| !g.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default();
            let user =
                UserInfo { name: fields[1].clone(), uid: fields[2].clone(), groups, extra: BTreeMap::new() };
            match by_digest.entry(token_digest(&fields[0])) {
                Entry::Occupied(mut e) => {
                    warn!(path = %path.display(), line = line_no, "duplicate token in the token file; the later record wins");
                    e.insert(user);
                }
                Entry::Vacant(e) => {
                    e.insert(user);
                }
            }
        }
        Ok(Self { by_digest })
    }

    /// The user a token belongs to.
    pub(crate) fn authenticate(&self, token: &str) -> Option<&UserInfo> {
        self.by_digest.get(&token_digest(token))
    }

    /// How many tokens are known.
    pub(crate) fn len(&self) -> usize {
        self.by_digest.len()
    }
}

/// Why a line of the token file is not a CSV record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CsvError {
    /// A quoted field without its closing quote.
    #[error("unterminated quoted field")]
    UnterminatedQuotedField,
    /// Something else than a comma after a quoted field.
    #[error("unexpected {0:?} after a quoted field")]
    TextAfterQuotedField(char),
    /// A quote inside a field that does not start with one.
    #[error("bare \" in a non-quoted field")]
    BareQuote,
}

/// Splits one CSV record as Go's `encoding/csv` with `TrimLeadingSpace` does: fields are separated by
/// commas, a field may be double-quoted (then it may hold commas, and `""` stands for a quote).
fn split_csv_record(line: &str) -> Result<Vec<String>, CsvError> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let mut field = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    None => return Err(CsvError::UnterminatedQuotedField),
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => return Err(CsvError::TextAfterQuotedField(c)),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => {
                        fields.push(field);
                        break;
                    }
                    Some('"') => return Err(CsvError::BareQuote),
                    Some(c) => field.push(c),
                }
            }
        }
    }
}

/// Why a request was refused (the message goes into the 401 `Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) String);

/// Decides who a request on the main port comes from.
#[derive(Debug)]
pub(crate) struct Authenticator {
    tokens: Option<TokenAuthenticator>,
    webhook: Option<TokenReviewer>,
    anonymous: bool,
}

impl Authenticator {
    /// Token file (if any), TokenReview webhook (if any) and whether anonymous requests are allowed.
    pub(crate) fn new(
        tokens: Option<TokenAuthenticator>,
        webhook: Option<TokenReviewer>,
        anonymous: bool,
    ) -> Self {
        Self { tokens, webhook, anonymous }
    }

    /// The request's user: a verified client certificate first, then a bearer token (the token file, then
    /// a TokenReview when the webhook is on), then anonymous when enabled. Credentials that are presented
    /// but do not authenticate refuse the request even when anonymous access is on; so does a TokenReview
    /// that fails (logged, as the kubelet does: 401, not cached). An `Authorization` header with another
    /// scheme counts as no credentials (as in the API server).
    pub(crate) async fn authenticate(
        &self,
        cert: &ClientCert,
        authorization: Option<&HeaderValue>,
    ) -> Result<UserInfo, Refused> {
        if let ClientCert::User(user) = cert {
            return Ok(user.clone());
        }
        if let Some(token) = authorization.and_then(bearer_token) {
            if let Some(user) = self.tokens.as_ref().and_then(|t| t.authenticate(token)) {
                return Ok(user.clone());
            }
            return match &self.webhook {
                Some(webhook) => match webhook.review(token).await {
                    Ok(Some(user)) => Ok(user),
                    Ok(None) => Err(Refused("Unauthorized: invalid bearer token".to_owned())),
                    Err(e) => {
                        error!(error = %e, "cannot authenticate a bearer token: the TokenReview failed");
                        Err(Refused("Unauthorized".to_owned()))
                    }
                },
                None if self.tokens.is_none() => Err(Refused(
                    "bearer token authentication is not configured (--token-auth-file, \
                     --authentication-token-webhook)"
                        .to_owned(),
                )),
                None => Err(Refused("invalid bearer token".to_owned())),
            };
        }
        if let ClientCert::Unusable(reason) = cert {
            return Err(Refused(reason.clone()));
        }
        if self.anonymous {
            return Ok(UserInfo::anonymous());
        }
        Err(Refused(
            "Unauthorized: anonymous requests are disabled; authenticate with a client certificate or a bearer token"
                .to_owned(),
        ))
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), if it is one.
fn bearer_token(value: &HeaderValue) -> Option<&str> {
    let value = value.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TokenAuthenticator, AuthError> {
        TokenAuthenticator::parse(text, Path::new("tokens.csv"))
    }

    #[test]
    fn token_file_records_with_and_without_groups() {
        let tokens = parse(
            "\u{feff}abc123,alice,uid-1,\"system:masters,devs\"\nxyz,bob,uid-2\n\n  spaced , carol,uid-3,\r\n",
        )
        .expect("valid token file");
        assert_eq!(tokens.len(), 3);
        assert_eq!(
            tokens.authenticate("abc123"),
            Some(&UserInfo {
                name: "alice".into(),
                uid: "uid-1".into(),
                groups: vec!["system:masters".into(), "devs".into()],
                extra: BTreeMap::new(),
            })
        );
        assert_eq!(tokens.authenticate("xyz").map(|u| u.groups.len()), Some(0));
        // Leading spaces are trimmed (TrimLeadingSpace), trailing ones are part of the field.
        assert_eq!(tokens.authenticate("spaced ").map(|u| u.name.as_str()), Some("carol"));
        assert!(tokens.authenticate("abc12").is_none());
        assert!(tokens.authenticate("").is_none());
    }

    #[test]
    fn token_file_errors_name_the_line() {
        let err = parse("good,u,1\nonly-two,columns\n").expect_err("two columns are not enough");
        assert!(matches!(err, AuthError::TokenFileSyntax { line: 2, .. }), "{err}");
        assert!(err.to_string().contains("tokens.csv, line 2"), "{err}");
        let err = parse("tok,user,uid,\"unterminated\n").expect_err("unterminated quote");
        assert!(err.to_string().contains("unterminated"), "{err}");
    }

    #[test]
    fn empty_tokens_are_skipped_and_duplicates_replace() {
        let tokens = parse(",nobody,0\nt,first,1\nt,second,2\n").expect("valid");
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens.authenticate("t").map(|u| u.name.as_str()), Some("second"));
    }

    #[test]
    fn quoted_fields_may_hold_quotes() {
        assert_eq!(
            split_csv_record(r#"a,"b ""c"", d",e"#).expect("valid"),
            vec!["a".to_owned(), "b \"c\", d".to_owned(), "e".to_owned()]
        );
        assert_eq!(
            split_csv_record(r#"a,b"c"#).map_err(|e| e.to_string()),
            Err(r#"bare " in a non-quoted field"#.to_owned())
        );
        assert_eq!(
            split_csv_record(r#""a"b"#).map_err(|e| e.to_string()),
            Err("unexpected 'b' after a quoted field".to_owned())
        );
        assert_eq!(
            split_csv_record(r#""a"#).map_err(|e| e.to_string()),
            Err("unterminated quoted field".to_owned())
        );
    }

    #[tokio::test]
    async fn credentials_that_fail_refuse_even_with_anonymous_enabled() {
        let tokens = parse("good,alice,1\n").expect("valid");
        let auth = Authenticator::new(Some(tokens), None, true);
        let bearer = |t: &str| HeaderValue::from_str(&format!("Bearer {t}")).expect("header");
        assert_eq!(
            auth.authenticate(&ClientCert::None, Some(&bearer("good"))).await.map(|u| u.name),
            Ok("alice".into())
        );
        assert!(auth.authenticate(&ClientCert::None, Some(&bearer("bad"))).await.is_err());
        assert_eq!(auth.authenticate(&ClientCert::None, None).await, Ok(UserInfo::anonymous()));
        // Another scheme is not a credential this server checks.
        let basic = HeaderValue::from_static("Basic dXNlcjpwYXNz");
        assert_eq!(auth.authenticate(&ClientCert::None, Some(&basic)).await, Ok(UserInfo::anonymous()));
        assert!(auth.authenticate(&ClientCert::Unusable("no CN".into()), None).await.is_err());
        let strict = Authenticator::new(None, None, false);
        assert!(strict.authenticate(&ClientCert::None, None).await.is_err());
        assert!(strict.authenticate(&ClientCert::None, Some(&bearer("good"))).await.is_err());
    }
}
