"""The HTML report opens in a real browser (Debian's headless Chromium) with every network path
closed: the verdict and the plots are in the rendered DOM and the screenshot is not blank."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from edgekit.inputs.recipe import GateConfig
from edgekit.report.gate import compare_with_baseline
from tests.unit.report_factory import release_pair

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; "
                                                         ".ci/install.sh does it as root)")


def _chromium(profile, *args, timeout=90):
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}",
            # no network at all: any fetch the page tried would fail to resolve
            "--host-resolver-rules=MAP * ~NOTFOUND", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    old, new = release_pair(slower=1.3)
    new.variants[1].sustained = {"bins": [{"t_end_s": float(i), "p50": 0.65 + 0.01 * i} for i in range(1, 31)]}
    compare_with_baseline(new, old, None, GateConfig())
    paths = new.write(d)
    return paths["html"]


def test_dom_has_verdict_and_plots(page, tmp_path):
    proc = _chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert 'id="verdict"' in dom and "Gate FAILED" in dom
    assert dom.count("<svg") == 5  # latency, pareto, sustained, parity, comparison
    for pid in ("plot-latency", "plot-pareto", "plot-sustained", "plot-parity", "plot-comparison"):
        assert f'id="{pid}"' in dom, pid


def test_screenshot_is_not_blank(page, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    proc = _chromium(tmp_path / "profile", "--window-size=1280,2600", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (2600, 1280)
    assert img.std() > 20 and len(np.unique(img.reshape(-1, 3), axis=0)) > 200  # text, tables and plots drawn
    # the failed verdict's red banner is painted near the top of the page
    top = img[:300].reshape(-1, 3).astype(int)
    reddish = (top[:, 0] > 200) & (top[:, 1] < 240) & (top[:, 0] - top[:, 2] > 10)
    assert reddish.sum() > 1000
