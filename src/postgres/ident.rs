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
    }
}
