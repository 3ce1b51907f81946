//! The HTML report renders in a real browser: headless Chromium (from Debian; bin/test installs it and sets
//! ABLATE_CHROMIUM) takes a screenshot of `index.html` that is not blank and shows the summary table, and
//! its rendered DOM holds the table's rows and every plot.
use ablate::recipe::parse;
use ablate::run::sweep::{run_recipe, SweepOptions};
use std::process::Command;
use tch::Device;

#[test]
fn the_report_renders_in_headless_chromium() {
    let chromium = std::env::var("ABLATE_CHROMIUM")
        .expect("ABLATE_CHROMIUM names a headless Chromium (bin/test installs Debian's and sets it)");
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "Words for a report, written by a model trained for a few steps. ".repeat(100)).unwrap();
    let text = format!(
        "kind: lm\ndescription: a report <check> & escape\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 4\n  batch_size: 4\n  eval_interval: 2\n  eval_batches: 1\n  log_interval: 2\nsweep:\n  transformer.heads: [1, 2]\nseeds: [0, 1]\n",
        corpus.display()
    );
    let recipe = parse(&text, "report.yaml", "report", false).unwrap();
    let out = dir.path().join("out");
    run_recipe(&recipe, &SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None })
        .unwrap();
    let page = out.join("index.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("a report &lt;check&gt; &amp; escape"), "the description is escaped");
    let plots = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "png"))
        .count();
    assert_eq!(html.matches("src=\"data:image/png;base64,").count(), plots, "every plot embedded");

    let url = format!("file://{}", page.display());
    let headless = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,900"];
    let dom = Command::new(&chromium).args(headless).arg("--dump-dom").arg(&url).output().unwrap();
    assert!(dom.status.success(), "{}", String::from_utf8_lossy(&dom.stderr));
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("<table>") && dom.contains("heads=1") && dom.contains("heads=2"), "rendered DOM: {dom:.400}");

    let shot = dir.path().join("shot.png");
    let status = Command::new(&chromium)
        .args(headless)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    let channels = info.color_type.samples();
    let rgb = || pixels[..info.buffer_size()].chunks(channels).map(|p| (p[0], p[1], p[2]));
    let total = (info.width * info.height) as usize;
    let ink = rgb().filter(|&(r, g, b)| r < 200 || g < 200 || b < 200).count();
    assert!(ink * 100 > total, "the screenshot is (almost) blank: {ink} of {total} pixels drawn");
    // The table's header row has its own background colour (#dde5f0): the table was laid out and painted.
    let header = rgb().filter(|&p| p == (0xdd, 0xe5, 0xf0)).count();
    assert!(header > 5_000, "no table header in the screenshot ({header} pixels of its colour)");
}
