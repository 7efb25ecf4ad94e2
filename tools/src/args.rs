//! The benchmarks' command lines: `--flag value` or `--flag=value`, in any order.

/// A cursor over the arguments after `--`.
#[derive(Debug)]
pub struct Args<'a> {
    args: &'a [String],
    next: usize,
    flag: &'a str,
    inline: Option<&'a str>,
}

impl<'a> Args<'a> {
    /// The arguments `args` (the program's name left out).
    pub fn new(args: &'a [String]) -> Self {
        Args {
            args,
            next: 0,
            flag: "",
            inline: None,
        }
    }

    /// The next flag (of `--flag=value`, the part before `=`), or a positional word.
    pub fn next_flag(&mut self) -> Option<&'a str> {
        let arg = self.args.get(self.next)?.as_str();
        self.next += 1;
        (self.flag, self.inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
            _ => (arg, None),
        };
        Some(self.flag)
    }

    /// The value of the flag [`next_flag`](Self::next_flag) returned.
    ///
    /// # Errors
    ///
    /// `<flag> takes a value` when the arguments end.
    pub fn value(&mut self) -> Result<String, String> {
        if let Some(v) = self.inline {
            return Ok(v.to_owned());
        }
        let v = self.args.get(self.next).cloned();
        self.next += 1;
        v.ok_or_else(|| format!("{} takes a value", self.flag))
    }

    /// The value of the `--seed` flag [`next_flag`](Self::next_flag) returned, as a number.
    ///
    /// # Errors
    ///
    /// `--seed takes a value` when the arguments end, `--seed takes a number` when it is not
    /// one.
    pub fn seed(&mut self) -> Result<u64, String> {
        self.value()?
            .parse()
            .map_err(|_| format!("{} takes a number", self.flag))
    }

    /// What every benchmark does with a flag it does not know: `--bench` (what `cargo bench`
    /// passed when these were benches) and a positional word (a filter, as `cargo bench`
    /// handed every bench) are ignored.
    ///
    /// # Errors
    ///
    /// `options` for `--help` or `-h` (the caller prints the usage), `unknown option <flag>`
    /// for any other flag.
    pub fn other(&self) -> Result<(), String> {
        match self.flag {
            "--bench" => Ok(()),
            "--help" | "-h" => Err("options".into()),
            other if other.starts_with('-') => Err(format!("unknown option {other}")),
            _ => Ok(()),
        }
    }
}

/// The parsed options, or (on an error) `<tool>: <error>` and the usage on stderr and exit
/// code 2.
pub fn or_exit<T>(parsed: Result<T, String>, tool: &str, usage: &str) -> T {
    parsed.unwrap_or_else(|e| {
        eprintln!("{tool}: {e}\n{usage}");
        std::process::exit(2);
    })
}

/// The things a comma-separated list names, each once, in the order first named; `by_name`
/// says what one name stands for.
///
/// # Errors
///
/// The first error of `by_name`.
pub fn names<T: PartialEq>(
    list: &str,
    by_name: impl Fn(&str) -> Result<Vec<T>, String>,
) -> Result<Vec<T>, String> {
    let mut all = Vec::new();
    for name in list.split(',') {
        for thing in by_name(name.trim())? {
            if !all.contains(&thing) {
                all.push(thing);
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_values() {
        let args: Vec<String> = [
            "--a",
            "1",
            "--b=2",
            "word",
            "--seed=42",
            "--seed",
            "x",
            "word",
            "--c",
        ]
        .map(String::from)
        .to_vec();
        let mut args = Args::new(&args);
        assert_eq!(args.next_flag(), Some("--a"));
        assert_eq!(args.value().as_deref(), Ok("1"));
        assert_eq!(args.next_flag(), Some("--b"));
        assert_eq!(args.value().as_deref(), Ok("2"));
        assert_eq!(args.next_flag(), Some("word"));
        assert_eq!(args.other(), Ok(()));
        assert_eq!(args.next_flag(), Some("--seed"));
        assert_eq!(args.seed(), Ok(42));
        assert_eq!(args.next_flag(), Some("--seed"));
        assert_eq!(args.seed(), Err("--seed takes a number".into()));
        assert_eq!(args.next_flag(), Some("word"));
        assert_eq!(args.other(), Ok(()));
        assert_eq!(args.next_flag(), Some("--c"));
        assert_eq!(args.value(), Err("--c takes a value".into()));
        assert_eq!(args.other(), Err("unknown option --c".into()));
        assert_eq!(args.next_flag(), None);
    }
}
