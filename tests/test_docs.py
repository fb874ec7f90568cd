"""The documentation: the generated pages match the code and the result files, the site builds with warnings
as errors (every internal link and anchor resolves), and the README stays a short page whose links resolve."""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ctrkit.cli import build_parser, reference

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_pages_are_what_the_parsers_give():
    assert reference.main([str(ROOT / "docs"), "--check"]) == 0


def test_cli_reference_covers_every_command_and_flag():
    pages = reference.pages(build_parser())
    train = pages["cli/train.md"]
    for flag in ("--snapshot-ensemble", "--seed-ensemble", "--calibrate", "--sharding", "--amp"):
        assert f"`{flag}`" in train
    assert "## `ctrkit preprocess criteo`" in pages["cli/preprocess.md"]
    assert "## `ctrkit bench accuracy`" in pages["cli/bench.md"]
    assert set(pages) == {"cli/index.md"} | {f"cli/{name}.md" for name in reference._subcommands(build_parser())}


def test_cli_reference_check_fails_on_a_stale_page(tmp_path):
    shutil.copytree(ROOT / "docs" / "cli", tmp_path / "cli")
    page = tmp_path / "cli" / "train.md"
    page.write_text(page.read_text().replace("--snapshot-ensemble", "--snapshot-ensembles"))
    assert reference.main([str(tmp_path), "--check"]) == 1


def _render(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/render.py", *args], cwd=cwd, capture_output=True, text=True)


def test_benchmarks_page_is_what_the_result_files_give():
    done = _render("--check")
    assert done.returncode == 0, done.stderr


def test_benchmarks_page_check_fails_when_a_result_changes(tmp_path):
    for part in ("benchmarks", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    assert _render("--check", cwd=tmp_path).returncode == 0
    result = next((tmp_path / "benchmarks" / "results" / "preprocess").glob("*.json"))
    result.write_text(result.read_text().replace('"polars"', '"polars-changed"', 1))
    done = _render("--check", cwd=tmp_path)
    assert done.returncode == 1 and "out of date" in done.stderr


def test_collect_condenses_a_real_bench_train_run(tmp_path):
    """A real `ctrkit bench train` run, condensed by collect.py and rendered: the page shows its median."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import collect
    finally:
        sys.path.pop(0)
    raw = tmp_path / "raw"
    raw.mkdir()
    for rnd in (1, 2):
        subprocess.run([sys.executable, "-m", "ctrkit", "bench", "train", "--model", "dlrm", "--steps", "2",
                        "--repeats", "1", "--warmup", "1", "--table-rows", "1000", "--batch-size", "256",
                        "--output", str(raw / f"fp32_{rnd}.json")], check=True, capture_output=True)  # fmt: skip
    out = collect.collect("train", raw, command="test", results=tmp_path / "results")
    written = collect.json.loads(out.read_text())
    runs = [collect.json.loads((raw / f"fp32_{r}.json").read_text())["samples_per_s"] for r in (1, 2)]
    (row,) = written["rows"]
    assert row[0] == "fp32" and row[5] == round(collect.statistics.median(runs))
    assert out.name == f"{collect.machine_kind(written['machine'])}.json"
    assert written["machine"]["cores"] >= 1


CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `make docs` builds it, with warnings as errors."""
    if shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists():
        pytest.skip("mkdocs is not installed (pip install 'ctrkit[docs]')")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    out = tmp_path_factory.mktemp("docs") / "site"
    cmd = [str(mkdocs) if mkdocs.exists() else "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_site_builds_with_warnings_as_errors(site):
    assert (site / "decisions" / "calibration.html").exists()
    assert (site / "changelog.html").exists()
    assert (site / "cli" / "train.html").exists()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output stays the test's
        pass


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); CI installs it")
def test_site_renders_in_a_headless_browser(site):
    """The built pages, served on 127.0.0.1, in a real browser: titles, the navigation, the report's image, the
    search index, no script error, and no request leaves the machine."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/")
            home = page.evaluate("[document.querySelector('h1').textContent, document.body.innerText]")
            page.goto(f"{url}/training.html")
            page.wait_for_load_state("networkidle")
            images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
            title = page.title()
        finally:
            browser.close()
            server.shutdown()
    navigation = home[1].lower()  # innerText applies the theme's upper-casing of section captions
    assert home[0].strip().startswith("ctrkit") and "decision records" in navigation and "benchmarks" in navigation
    assert title.startswith("Training") and images and all(done and width > 100 for done, width in images)
    assert not errors, errors
    assert any(u.endswith("search_index.json") for u in requests), requests  # the search worker loaded its index
    assert all(u.startswith((url, "data:")) for u in requests), [u for u in requests if not u.startswith(url)]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); CI installs it")
def test_the_search_finds_a_flag_and_a_stop_word(site):
    """The site's search, in a real browser: `--like` (a query lunr would parse as operators) and `like` (a word
    lunr's stop words drop) both list the pages that say it."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    found = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            for query in ("--like", "like"):
                page.goto(f"{url}/search.html?q={query}")
                page.wait_for_function("document.querySelectorAll('#mkdocs-search-results a').length > 0 || "
                                       "document.querySelector('#mkdocs-search-results').innerText.includes('No ')",
                                       timeout=20_000)  # fmt: skip
                found[query] = page.evaluate("Array.from(document.querySelectorAll('#mkdocs-search-results a'))"
                                             ".map(a => a.getAttribute('href'))")  # fmt: skip
        finally:
            browser.close()
            server.shutdown()
    for query, links in found.items():
        assert any("dynamic-tables" in link or "preprocessing" in link for link in links), (query, links)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium); CI installs it")
def test_site_opened_from_disk_links_to_pages_and_fits_its_tables(site):
    """Opened as files (file://), as `make docs` says to: a link leads to a page, not a directory listing; in a
    1280 px window the text column takes the width beside the navigation and no table of the CLI reference or the
    benchmarks hides columns behind a scrollbar."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((site / "index.html").as_uri())
            cells = page.evaluate("""Array.from(document.querySelectorAll('table tr td:first-child')).map(td => {
                const r = document.createRange(); r.selectNodeContents(td); return [td.textContent,
                r.getClientRects().length]; })""")  # the lines each first-column cell of the home page takes
            page.click("nav a[href='training.html']")
            page.wait_for_load_state()
            landed = page.evaluate(
                "[location.href, document.querySelector('h1') && document.querySelector('h1').textContent]"
            )
            widths = {}
            for name in ("cli/index.html", "cli/train.html", "benchmarks.html"):
                page.goto((site / name).as_uri())
                widths[name] = page.evaluate(
                    """[document.querySelector('.wy-nav-content').getBoundingClientRect().width,
                        Array.from(document.querySelectorAll('table')).map(t => [t.scrollWidth,
                            t.parentElement.clientWidth])]"""
                )
        finally:
            browser.close()
    words = [(text, lines) for text, lines in cells if " " not in text.strip()]
    assert words and all(lines == 1 for _, lines in words), words  # no word cut ("preproce ssing")
    assert landed[0].endswith("/training.html") and landed[1] and landed[1].strip().startswith("Training"), landed
    for name, (column, tables) in widths.items():
        assert column >= 900, (name, column)  # 1280 less the 300 px navigation, not the theme's 800
        assert tables and all(scroll <= width + 1 for scroll, width in tables), (name, tables)


def test_site_build_fails_on_a_broken_link(tmp_path):
    if shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists():
        pytest.skip("mkdocs is not installed")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[a missing anchor](training.md#no-such-section)\n")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run([str(mkdocs) if mkdocs.exists() else "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "no-such-section" in done.stderr


def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 300
    first_screen = "\n".join(lines[:40])
    assert "make demo" in first_screen and "make test" in first_screen
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    assert "../shared" not in text, "the README points outside the repository"
    # what a newcomer meets: where the command is, how long the tests take and what they need
    assert "source .venv/bin/activate" in text and ".venv/bin/ctrkit" in text
    assert re.search(r"about \d+ minutes", text) and "apt-get install chromium" in text


def test_no_dated_narrative_in_the_documentation():
    """Dates belong to results (the generated tables) and decision records, not to the pages that describe
    the product."""
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index("<!-- headline:"), readme.index("<!-- /headline -->")
    pages = {"README.md": readme[:start] + readme[end:]}
    pages |= {p.name: p.read_text() for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"}
    for name, text in pages.items():  # the blocks generated from result files name their runs' dates
        text = re.sub(r"<!-- demo: generated.*?<!-- /demo -->", "", text, flags=re.S)
        page = Path(name)
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{page.name} quotes a date"
        assert not re.search(r"\b(this|last|previous|next|earlier) session\b", text, re.I), page.name
