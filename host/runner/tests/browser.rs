//! The HTML report in a real browser: headless Chromium renders the page to a PNG, and
//! the charts' line colours must be on it, in quantity, where the same page without its
//! charts shows none. (A file that merely exists, or SVG a browser refuses, fails.)
//!
//! `.ci/run` installs Debian's chromium and sets RUNNER_REQUIRE_BROWSER=1, so in CI a
//! missing browser fails the test; elsewhere it says it skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> common::Scratch {
    common::scratch("browser", name)
}

fn browser() -> Option<PathBuf> {
    if let Some(b) = std::env::var_os("RUNNER_BROWSER") {
        return Some(PathBuf::from(b));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Render `page` to a PNG with headless Chromium; the decoded RGBA pixels.
fn screenshot(browser: &Path, page: &Path, dir: &Path) -> Vec<[u8; 3]> {
    let shot = dir.join(format!("{}.png", page.file_stem().unwrap().to_string_lossy()));
    let _ = std::fs::remove_file(&shot);
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--allow-file-access-from-files",
            "--window-size=1400,2600",
            &format!("--user-data-dir={}", dir.join("profile").display()),
            &format!("--screenshot={}", shot.display()),
            &format!("file://{}", page.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the browser starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{} did not finish rendering in 120 s", browser.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let file = std::fs::File::open(&shot).unwrap_or_else(|e| panic!("no screenshot {}: {e}", shot.display()));
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    assert!(step >= 3, "{:?}", info.color_type);
    buf[..info.buffer_size()].chunks(step).map(|p| [p[0], p[1], p[2]]).collect()
}

fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

/// Pixels within a small distance of `colour` (anti-aliasing blends line edges).
fn count(pixels: &[[u8; 3]], colour: [u8; 3]) -> usize {
    pixels.iter().filter(|p| p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 6)).count()
}

#[test]
fn the_html_report_draws_its_charts_in_a_real_browser() {
    let Some(browser) = browser() else {
        assert!(std::env::var_os("RUNNER_REQUIRE_BROWSER").is_none(), "RUNNER_REQUIRE_BROWSER is set but no chromium was found");
        eprintln!("skipped: no chromium on PATH (RUNNER_BROWSER names one)");
        return;
    };
    let dir = scratch("report");
    let o = Command::new(env!("CARGO_BIN_EXE_runner"))
        .current_dir(&dir)
        .args(["--plugin", "llama3", "--gpus", "8,16,32,64", "--cloud", "aws,lambda", "--repeats", "1", "-o", "report.html", "-q", "--no-history"])
        .env("XDG_DATA_HOME", dir.join("data"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = dir.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    // The same page without its charts: the control.
    let mut bare = String::new();
    let mut rest = html.as_str();
    while let Some(i) = rest.find("<svg") {
        bare.push_str(&rest[..i]);
        let j = rest[i..].find("</svg>").unwrap() + i + "</svg>".len();
        rest = &rest[j..];
    }
    bare.push_str(rest);
    assert!(bare.len() < html.len());
    let control = dir.join("bare.html");
    std::fs::write(&control, bare).unwrap();

    let drawn = screenshot(&browser, &page, &dir);
    let none = screenshot(&browser, &control, &dir);
    // Series lines in the first two palette colours (BF16, FP8), the sweet-spot mark.
    for (what, hex, least) in [("first series", "#0072B2", 300), ("second series", "#E69F00", 300), ("sweet spot mark", "#D55E00", 30)] {
        let (with, without) = (count(&drawn, rgb(hex)), count(&none, rgb(hex)));
        assert!(with >= least, "{what} ({hex}): {with} pixels drawn, want at least {least}");
        assert!(without < least / 10, "{what} ({hex}): {without} pixels on the page without charts");
    }
}
