"""``report.html`` in a real browser (Debian's ``chromium``, headless): it loads with no error
(a hook put before the page's own content writes every error event, console error and broken
image into the DOM, read back with ``--dump-dom``; every host name resolves to nothing, so a
fetch would be an error), every section's heading is there, the screenshot is not blank and
``--print-to-pdf`` gives a PDF.  Skipped without chromium unless LLMBENCH_REQUIRE_CHROMIUM=1."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.evidence.cli import main
from exporter.evidence.report.doc import SECTION_TITLES

from tests.helpers import skip_or_fail
from tests.report_records import PLAN, write_records

pytestmark = pytest.mark.slow  # starts a browser

_HOOK = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(String(e.message || (e.target && (e.target.tagName + ' ' + (e.target.src || e.target.href)))));
}, true);
window.addEventListener('unhandledrejection', function () { window.__errors.push('unhandled rejection'); });
console.error = function () { window.__errors.push(Array.prototype.join.call(arguments, ' ')); };
window.addEventListener('load', function () {
  var bad = Array.prototype.filter.call(document.images, function (i) { return !(i.complete && i.naturalWidth > 0); });
  document.body.setAttribute('data-errors', JSON.stringify(window.__errors));
  document.body.setAttribute('data-images', String(document.images.length));
  document.body.setAttribute('data-broken-images', String(bad.length));
});
</script>"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    skip_or_fail(None if found else "chromium not installed (apt-get install -y --no-install-recommends chromium)",
                 "LLMBENCH_REQUIRE_CHROMIUM")
    assert found is not None
    return found


def _run(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("browser")
    plan = base / "plan.yaml"
    plan.write_text(PLAN)
    out = base / "out"
    assert main(["report", "--format", "html", "--records", str(write_records(base / "records")), "--plan", str(plan),
                 "--out", str(out)]) == 0
    return out / "report.html"


def test_the_page_loads_with_no_error_and_every_section(page: Path, tmp_path: Path) -> None:
    browser = _chromium()
    hooked = tmp_path / "hooked.html"
    hooked.write_text(page.read_text().replace("<head>", "<head>" + _HOOK, 1))
    proc = _run(browser, tmp_path / "profile", "--virtual-time-budget=10000", "--dump-dom", hooked.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body is not None, proc.stdout[:500]
    attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1)))
    assert json.loads(attrs["data-errors"].replace("&quot;", '"')) == []
    assert attrs["data-broken-images"] == "0" and int(attrs["data-images"]) == 6
    headings = re.findall(r"<h2>([^<]*)</h2>", proc.stdout)
    assert headings == list(SECTION_TITLES)


def test_screenshot_is_not_blank_and_the_pdf_prints(page: Path, tmp_path: Path) -> None:
    browser = _chromium()
    from PIL import Image

    shot, pdf = tmp_path / "shot.png", tmp_path / "report.pdf"
    proc = _run(browser, tmp_path / "p1", "--window-size=1280,2400", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    with Image.open(shot) as im:
        gray = im.convert("L")
        dark = sum(gray.histogram()[:200])  # pixels clearly darker than the white page
        assert dark > 0.01 * gray.width * gray.height
    proc = _run(browser, tmp_path / "p2", "--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.as_uri())
    assert proc.returncode == 0 and pdf.is_file(), proc.stderr[-2000:]
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and data.count(b"/Type /Page") - data.count(b"/Type /Pages") >= 2
