//! SQL identifiers the crate builds statements with (the fencing table, the job tables).

/// PostgreSQL's longest identifier, in bytes (`NAMEDATALEN - 1`): longer ones are truncated.
const MAX_IDENTIFIER: usize = 63;

/// Whether `name` can be an identifier as given: not empty, no longer than PostgreSQL keeps
/// (a longer one would be truncated, silently naming another table), and without a NUL byte.
pub(crate) fn is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_IDENTIFIER && !name.contains('\0')
}

/// `name` as a PostgreSQL identifier in double quotes, its own double quotes doubled.
pub(crate) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `table` in `schema` (the `search_path`'s first when `None`), each name quoted
/// ([`quote`]): the name of a table the crate builds statements with. `Err` names the first
/// name that is not valid ([`is_valid`]).
pub(crate) fn qualified(schema: Option<&str>, table: &str) -> Result<String, String> {
    for name in schema.iter().chain([&table]) {
        if !is_valid(name) {
            return Err((*name).to_owned());
        }
    }
    Ok(match schema {
        Some(schema) => format!("{}.{}", quote(schema), quote(table)),
        None => quote(table),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_kept_whole_or_refused() {
        assert!(is_valid("pg_elector_epochs"));
        assert!(is_valid(&"x".repeat(63)));
        assert!(!is_valid(&"x".repeat(64)));
        assert!(!is_valid(""));
        assert!(!is_valid("a\0b"));
        assert_eq!(quote("Ops\"x"), "\"Ops\"\"x\"");
        assert_eq!(qualified(Some("Ops"), "t").unwrap(), "\"Ops\".\"t\"");
        assert_eq!(qualified(None, "t").unwrap(), "\"t\"");
        assert_eq!(qualified(Some(""), "t").unwrap_err(), "");
    }
}
