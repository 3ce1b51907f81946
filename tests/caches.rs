//! Caches that several processes fill at once (issue 67): the shell side. The torch install and the other
//! entries `bin/bootstrap.sh` puts into the cache go through its `ablate_locked`; here four shells install
//! one entry at the same moment through it, with a stand-in installer (no network): all four succeed, one
//! installs, the others say that they wait, and the entry is whole. The data cache's side (the corpus, the
//! image sets, the pretrained weights) is tested in `src/data/text.rs` with six processes of its own code.
use std::path::Path;
use std::process::Command;

/// A shell that sources the bootstrap script and installs `entry` through `ablate_locked` with a stand-in
/// installer: written under `.partial` over two seconds, then renamed, as the real installers do.
fn installing_shell(entry: &Path, barrier: &Path, shells: usize) -> std::process::Child {
    let script = format!(
        r#"source "{root}/bin/bootstrap.sh"
fake_install() {{
  local target="$1"
  [[ -f "$target/done" ]] && return 0
  echo "installing" >&2
  rm -rf "$target.partial" && mkdir -p "$target.partial"
  for i in $(seq 1 50); do echo "line $i" >> "$target.partial/payload"; sleep 0.04; done
  touch "$target.partial/done"
  mv "$target.partial" "$target"
}}
touch "{barrier}/$$"
until [[ $(ls "{barrier}" | wc -l) -ge {shells} ]]; do sleep 0.01; done
[[ -f "{entry}/done" ]] || ablate_locked "{entry}.lock" "a stand-in" fake_install "{entry}"
[[ $(wc -l < "{entry}/payload") -eq 50 ]]
"#,
        root = env!("CARGO_MANIFEST_DIR"),
        barrier = barrier.display(),
        entry = entry.display(),
    );
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash")
}

#[test]
fn shells_installing_one_entry_at_once_take_turns_and_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let barrier = dir.path().join("barrier");
    std::fs::create_dir(&barrier).unwrap();
    let entry = dir.path().join("cache/torch-stand-in");
    const SHELLS: usize = 4;
    let shells: Vec<_> = (0..SHELLS).map(|_| installing_shell(&entry, &barrier, SHELLS)).collect();
    let (mut installed, mut waited) = (0, 0);
    for shell in shells {
        let out = shell.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "a shell failed:\n{said}");
        installed += said.matches("installing\n").count();
        waited += said.matches("ablate: waiting for another ablate process to finish installing a stand-in").count();
    }
    assert_eq!(installed, 1, "exactly one shell installs");
    // The stand-in takes two seconds, so the shells released with the installer find the lock held.
    assert!(waited >= 1, "a shell that finds the lock held says that it waits");
    assert!(!dir.path().join("cache/torch-stand-in.partial").exists());
}

/// A failing installer's status reaches the caller through the lock (under `set -e`, a status lost in the
/// helper would be taken for success).
#[test]
fn a_failed_install_under_the_lock_fails_its_caller() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "source \"{}/bin/bootstrap.sh\"\nablate_locked \"{}/x.lock\" x false || exit 7\nexit 0\n",
        env!("CARGO_MANIFEST_DIR"),
        dir.path().display()
    );
    let status = Command::new("bash").arg("-c").arg(script).status().unwrap();
    assert_eq!(status.code(), Some(7));
}
