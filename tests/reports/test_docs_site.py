"""The docs site: `mkdocs build --strict` succeeds, and two of its pages render in headless Chromium.

The site is served on 127.0.0.1 and opened through a probe page on the same server, which loads the page in a
frame, waits for its images, and writes what rendered (headings, each image's natural width) into its own DOM;
Chromium's ``--dump-dom`` returns it. The home page (README) and a grid page (made from the grid's YAML at build
time) must each show their headings and an image that loaded.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_browser import _chromium, chromium  # noqa: F401 - the fixture

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]

PROBE = """<!doctype html><html><body><div id="probe">pending</div><iframe id="page" width="1200" height="900"></iframe>
<script>
const frame = document.getElementById("page");
const text = e => { const c = e.cloneNode(true); c.querySelectorAll(".headerlink").forEach(x => x.remove()); return c.textContent.trim(); };
frame.onload = () => {
  const doc = frame.contentDocument;
  const images = [...doc.querySelectorAll("article img")];
  const loaded = images.map(i => i.complete ? Promise.resolve() : new Promise(r => { i.onload = i.onerror = r; }));
  Promise.all(loaded).then(() => {
    document.getElementById("probe").textContent = JSON.stringify({
      h1: [...doc.querySelectorAll("article h1")].map(text),
      h2: [...doc.querySelectorAll("article h2")].map(text),
      images: images.map(i => ({src: i.getAttribute("src"), width: i.naturalWidth})),
    });
  });
};
frame.src = new URLSearchParams(location.search).get("page");
</script></body></html>
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (out / "probe.html").write_text(PROBE)
    return out


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines in the test output
        pass


def rendered(binary: str, server: str, page: str, tmp: Path) -> dict:
    dom = _chromium(binary, tmp, "--dump-dom", f"{server}/probe.html?page={page}")
    m = re.search(r'<div id="probe">(.*?)</div>', dom, re.S)
    assert m and m.group(1) != "pending", f"the probe never saw {page} load: {dom[:2000]}"
    return json.loads(html.unescape(m.group(1)))


def test_the_home_page_is_the_readme_with_its_headings_and_an_image(chromium, server, tmp_path):  # noqa: F811
    page = rendered(chromium, server, "/", tmp_path)
    readme = (ROOT / "README.md").read_text()
    assert page["h1"] == [readme.splitlines()[0].removeprefix("# ").strip()]
    assert page["h2"] and all(h in readme for h in page["h2"])
    assert any(img["width"] > 0 for img in page["images"]), page["images"]


def test_a_grid_page_shows_its_scales_and_its_trials_image(chromium, server, tmp_path):  # noqa: F811
    page = rendered(chromium, server, "/grids/batch_vs_dim/", tmp_path)
    assert page["h1"] == ["batch_vs_dim"]
    assert page["h2"] == ["Smoke scale", "Laptop scale", "Paper scale"]
    (image,) = page["images"]
    assert image["src"].endswith("batch_vs_dim.svg") and image["width"] > 0
