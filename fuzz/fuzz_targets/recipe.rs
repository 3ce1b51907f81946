//! The recipe loader on arbitrary input: it must never panic, and every rejection must be one line that
//! points inside the file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    if let Err(e) = ablate::recipe::parse(text, "fuzz.yaml", "fuzz", flags & 1 == 1) {
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "a rejection spans several lines: {shown:?}");
        assert!(shown.starts_with("fuzz.yaml"), "a rejection does not name the file: {shown:?}");
        // Lines as YAML counts them: a lone carriage return also ends a line.
        let lines = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
        assert!(e.line <= lines, "line {} is outside the file ({lines} lines): {shown}", e.line);
    }
});
