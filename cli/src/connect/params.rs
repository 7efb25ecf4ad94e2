//! The TLS settings of a database URL, taken out before tokio-postgres reads the rest: libpq's
//! `sslmode` values (tokio-postgres knows only disable, prefer and require), `sslrootcert`,
//! `sslcert` and `sslkey` (which tokio-postgres refuses as unknown options). Both forms of the
//! URL: `postgres://…?sslmode=verify-full&sslrootcert=…` and `host=… sslmode=verify-full`.

use std::borrow::Cow;

/// How hard to insist on TLS and on checking the server, as libpq's `sslmode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS settings a URL gave (`None`: not given).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TlsParams {
    pub(crate) mode: Option<SslMode>,
    pub(crate) root_cert: Option<String>,
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
}

/// A URL split in two: what tokio-postgres reads, and the TLS settings.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) rest: String,
    pub(crate) tls: TlsParams,
}

/// Splits `url` (either form). A setting given twice takes its last value, as in libpq.
pub(crate) fn split(url: &str) -> Result<Split, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        split_url(url)
    } else {
        split_key_values(url)
    }
}

fn split_url(url: &str) -> Result<Split, String> {
    let mut tls = TlsParams::default();
    // Where tokio-postgres finds the query: after the credentials (up to the first `@`, so a
    // password may hold a `?`), at the first `?`.
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let credentials_end = url[after_scheme..].find('@').map(|at| after_scheme + at);
    // libpq ends the credentials at a `/` (the host's end) and tokio-postgres does not: an `@`
    // in the path or the query would make them read different hosts and settings.
    if credentials_end.is_some_and(|end| url[after_scheme..end].contains('/')) {
        return Err(
            "the database URL has an '@' after the host: write it as %40 (and a '/' \
             in a user name or password as %2F)"
                .to_owned(),
        );
    }
    let from = credentials_end.map_or(after_scheme, |end| end + 1);
    let Some(mark) = url[from..].find('?').map(|at| from + at) else {
        return Ok(Split {
            rest: url.to_owned(),
            tls,
        });
    };
    let (base, query) = (&url[..mark], &url[mark + 1..]);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !take(&mut tls, &decode(key)?, &decode(value)?)? {
            kept.push(pair);
        }
    }
    let rest = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    Ok(Split { rest, tls })
}

fn decode(text: &str) -> Result<Cow<'_, str>, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map_err(|_| "the database URL: a setting is not UTF-8 once percent-decoded".to_owned())
}

/// Splits the `key=value` form. Where the text stops making sense (no `=`, an open quote),
/// it is refused: tokio-postgres would stop reading there without a word, settings after it
/// (an sslmode) unread.
fn split_key_values(text: &str) -> Result<Split, String> {
    let mut tls = TlsParams::default();
    let mut kept = Vec::new();
    let mut at = 0;
    while let Some((key, value, end)) = next_pair(text, at) {
        if !take(&mut tls, key, &value)? {
            kept.push(text[at..end].trim_start());
        }
        at = end;
    }
    if !text[at..].trim().is_empty() {
        // Not the text itself: it may hold a password.
        return Err(format!(
            "the database URL: cannot read its key=value pairs from character {} on (a key \
             without '=', or a quote left open)",
            text[..at].chars().count() + blanks(&text[at..]) + 1
        ));
    }
    Ok(Split {
        rest: kept.join(" "),
        tls,
    })
}

/// The pair starting at byte `from` (after any blanks): its key, its value unquoted and
/// unescaped, and the byte where it ends. `None` at the end or where no pair can be read.
fn next_pair(text: &str, from: usize) -> Option<(&str, String, usize)> {
    let start = from + blanks(&text[from..]);
    let key_len = text[start..].find(|c: char| c == '=' || c.is_whitespace())?;
    let key = &text[start..start + key_len];
    let mut at = start + key_len;
    at += blanks(&text[at..]);
    if key.is_empty() || !text[at..].starts_with('=') {
        return None;
    }
    at += 1;
    at += blanks(&text[at..]);
    let (value, len) = read_value(&text[at..])?;
    Some((key, value, at + len))
}

fn blanks(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// A value (`'quoted'` or bare, with `\` escaping the next character) and its length in `text`.
fn read_value(text: &str) -> Option<(String, usize)> {
    let quoted = text.starts_with('\'');
    let mut value = String::new();
    let mut chars = text.char_indices().skip(usize::from(quoted));
    while let Some((i, c)) = chars.next() {
        match c {
            // A backslash at the very end escapes nothing (tokio-postgres drops it too).
            '\\' => match chars.next() {
                Some((_, next)) => value.push(next),
                None if !quoted => return Some((value, text.len())),
                None => return None,
            },
            '\'' if quoted => return Some((value, i + 1)),
            c if !quoted && c.is_whitespace() => return Some((value, i)),
            c => value.push(c),
        }
    }
    (!quoted).then_some((value, text.len()))
}

/// Takes `key` into `tls` when it is a TLS setting; `false` for any other key.
fn take(tls: &mut TlsParams, key: &str, value: &str) -> Result<bool, String> {
    let slot = match key {
        "sslmode" => {
            tls.mode = Some(mode(value)?);
            return Ok(true);
        }
        "sslrootcert" => &mut tls.root_cert,
        "sslcert" => &mut tls.cert,
        "sslkey" => &mut tls.key,
        _ => return Ok(false),
    };
    *slot = Some(value.to_owned());
    Ok(true)
}

fn mode(value: &str) -> Result<SslMode, String> {
    Ok(match value {
        "disable" => SslMode::Disable,
        "allow" => SslMode::Allow,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(format!(
                "the database URL: sslmode={other:?} is none of disable, allow, prefer, \
                 require, verify-ca, verify-full"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(mode: Option<SslMode>, root: Option<&str>) -> TlsParams {
        TlsParams {
            mode,
            root_cert: root.map(str::to_owned),
            ..TlsParams::default()
        }
    }

    #[test]
    fn a_url_keeps_its_other_settings_and_gives_the_tls_ones() {
        let got = split(
            "postgres://app:p%40ss@db:5432/app?application_name=x&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca%20file.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            got.rest,
            "postgres://app:p%40ss@db:5432/app?application_name=x&connect_timeout=3"
        );
        assert_eq!(
            got.tls,
            tls(Some(SslMode::VerifyFull), Some("/etc/ca file.pem"))
        );
        let only = split_url("postgresql://db/app?sslmode=require&sslmode=verify-ca").unwrap();
        assert_eq!(only.rest, "postgresql://db/app");
        assert_eq!(only.tls, tls(Some(SslMode::VerifyCa), None));
        let none = split("postgres://db/app").unwrap();
        assert_eq!(
            (none.rest.as_str(), none.tls),
            ("postgres://db/app", tls(None, None))
        );
    }

    #[test]
    fn key_values_are_read_as_libpq_reads_them() {
        let got = split(
            "host=db  user = app sslmode=verify-ca sslrootcert='/a dir/it\\'s.pem' \
             sslcert=/c\\ d sslkey = /k dbname=app",
        )
        .unwrap();
        assert_eq!(got.rest, "host=db user = app dbname=app");
        assert_eq!(got.tls.mode, Some(SslMode::VerifyCa));
        assert_eq!(got.tls.root_cert.as_deref(), Some("/a dir/it's.pem"));
        assert_eq!(got.tls.cert.as_deref(), Some("/c d"));
        assert_eq!(got.tls.key.as_deref(), Some("/k"));
    }

    #[test]
    fn what_cannot_be_read_is_refused_without_the_password() {
        let e = split("host=db sslmode=require user").unwrap_err();
        assert!(e.contains("character 25"), "{e}");
        let e = split("host=db password='s3cret sslmode=verify-full").unwrap_err();
        assert!(e.contains("character 9") && !e.contains("s3cret"), "{e}");
        let e = split("host=db =x sslmode=verify-full").unwrap_err();
        assert!(e.contains("character 9"), "{e}");
        let e = split("postgres://db/app?sslmode=verify-full&application_name=a@b").unwrap_err();
        assert!(e.contains("%40"), "{e}");
        assert!(split("postgres://u:p%2Fw@db/app").is_ok());
    }

    /// Found where tokio-postgres finds them, so that none is left for it to read (it would
    /// read `require` and the pool would then set `prefer`).
    #[test]
    fn a_question_mark_in_the_password_or_a_last_backslash_hides_no_setting() {
        let got = split("postgres://u:pa?ss@db/app?sslmode=require").unwrap();
        assert_eq!(got.rest, "postgres://u:pa?ss@db/app");
        assert_eq!(got.tls.mode, Some(SslMode::Require));
        let got = split("host=db sslmode=require\\").unwrap();
        assert_eq!(
            (got.rest.as_str(), got.tls.mode),
            ("host=db", Some(SslMode::Require))
        );
    }

    #[test]
    fn an_unknown_sslmode_is_named_without_the_rest_of_the_url() {
        let e = split("postgres://app:secret@db/app?sslmode=verify").unwrap_err();
        assert!(e.contains("sslmode=\"verify\""), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = split("host=db sslmode=strict").unwrap_err();
        assert!(e.contains("verify-full"), "{e}");
    }
}
