//! The recipe loader on arbitrary input, with arbitrary command-line overrides: it must never panic, and
//! every rejection must be one line that points inside the file or names the offending argument.
//!
//! Input: a flags byte (bit 0: `--smoke`), then the recipe text; text after a line `--args` is not part of
//! the recipe but one command-line argument per line (`key=value`, `--sweep key=v1,v2`, `--seeds 0,1`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let Ok(input) = std::str::from_utf8(rest) else { return };
    let (text, args) = match input.split_once("\n--args\n") {
        Some((text, args)) => (text, args.lines().collect::<Vec<_>>()),
        None => (input, Vec::new()),
    };
    let (mut set, mut sweep, mut seeds) = (Vec::new(), Vec::new(), None);
    for arg in args {
        if let Some(s) = arg.strip_prefix("--sweep ") {
            sweep.push(s.to_string());
        } else if let Some(s) = arg.strip_prefix("--seeds ") {
            seeds = Some(s.to_string());
        } else {
            set.push(arg.to_string());
        }
    }
    let one_line = |shown: &str| assert!(!shown.contains('\n'), "a rejection spans several lines: {shown:?}");
    let overrides = match ablate::recipe::Overrides::parse(&set, &sweep, seeds.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            let shown = e.to_string();
            one_line(&shown);
            assert!(shown.starts_with("argument `"), "a bad argument is not named: {shown:?}");
            return;
        }
    };
    if let Err(e) = ablate::recipe::parse_with(text, "fuzz.yaml", "fuzz", flags & 1 == 1, &overrides) {
        let shown = e.to_string();
        one_line(&shown);
        if e.argument.is_some() {
            assert!(shown.starts_with("argument `"), "an argument's error does not name it: {shown:?}");
            return;
        }
        assert!(shown.starts_with("fuzz.yaml"), "a rejection does not name the file: {shown:?}");
        // Lines as YAML counts them: a lone carriage return also ends a line.
        let lines = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
        assert!(e.line <= lines, "line {} is outside the file ({lines} lines): {shown}", e.line);
    }
});
