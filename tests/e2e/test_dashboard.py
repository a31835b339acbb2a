"""`rrtrain dashboard` on a small finished sweep, in a real browser (Debian's chromium driven by Playwright)
and through TensorBoard's HTTP data API."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from trainutil import PY, REPO, env, free_port, kill_group, losses, records, train

CHROMIUM = "/usr/bin/chromium"
APT_LOCK = "/var/lock/rrtrain-apt.lock"  # shared with slurm/local/start.sh
FAST = ["train.max_steps=6", "train.log_every=1", "train.eval_every=3", "train.diag_every=3", "train.global_batch=4",
        "train.micro_batch=4", "train.warmup_steps=1"]
SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ff=64"]
RUNS = {("tiny", "review", 0): [], ("tiny", "standard", 0): [],
        ("rr-60m", "review", 0): ["model.size=rr-60m", *SMALL], ("rr-60m", "standard", 0): ["model.size=rr-60m", *SMALL]}


def _need(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must run the dashboard test)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed here when missing (as root); skipped only where that cannot be done."""
    if not Path(CHROMIUM).exists():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            _need("chromium is missing and cannot be installed here (no apt-get or not root)")
        apt = ["flock", APT_LOCK, "apt-get", "-o", "DPkg::Lock::Timeout=600"]  # one apt-get at a time (start.sh too)
        for cmd in ([*apt, "update", "-qq"], [*apt, "install", "-y", "-qq", "chromium"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if proc.returncode:
                _need(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-300:]}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _need("the playwright package is not installed (pip install playwright)")
    return CHROMIUM


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, stories_data) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    for (size, variant, seed), extra in RUNS.items():
        train(root / f"{size}-{variant}-s{seed}", stories_data, *FAST, f"model.variant={variant}", *extra)
    return root


def get(port: int, path: str, **query: str):
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def dashboard(sweep):
    port = free_port()
    proc = subprocess.Popen([PY, "-m", "rrtrain", "dashboard", str(sweep), "--port", str(port)], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in first and f"{len(RUNS)} runs" in first, first
        deadline = time.time() + 120
        while True:
            try:
                if len(get(port, "/data/runs")) >= len(RUNS):
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "TensorBoard did not come up"
            time.sleep(0.5)
        yield port
    finally:
        kill_group(proc)


def test_runs_and_scalars_through_the_http_api(dashboard, sweep):
    runs = get(dashboard, "/data/runs")
    names = {f"{s}/{v}/seed{n}" for s, v, n in RUNS}
    assert names <= set(runs), runs
    got = get(dashboard, "/data/plugin/scalars/scalars", run="tiny/review/seed0", tag="train/loss")
    want = losses(sweep / "tiny-review-s0")
    assert [(step, round(value, 5)) for _, step, value in got] == [(s, round(want[s], 5)) for s in sorted(want)]
    per_size = get(dashboard, "/data/plugin/scalars/scalars", run="rr-60m/standard/seed0", tag="rr-60m/train_loss")
    assert [step for _, step, _ in per_size] == list(range(1, 7))
    tags = get(dashboard, "/data/plugin/scalars/tags")
    assert "tiny/train_loss" in tags["tiny/standard/seed0"] and "rr-60m/train_loss" not in tags["tiny/standard/seed0"]
    assert "tiny/gate_mean/000" in tags["tiny/review/seed0"]
    hists = get(dashboard, "/data/plugin/histograms/tags")
    assert "gates/000" in hists["tiny/review/seed0"]
    layout = get(dashboard, "/data/plugin/custom_scalars/layout")
    titles = {c["title"]: [ch["title"] for ch in c["chart"]] for c in layout["category"]}
    assert titles["size tiny"] == ["train loss", "val loss", "grad norm", "gate mean per block"], titles
    final = json.loads((sweep / "tiny-review-s0" / "final.json").read_text())
    val = get(dashboard, "/data/plugin/scalars/scalars", run="tiny/review/seed0", tag="hparams/final_val_loss")
    assert val[-1][2] == pytest.approx(final["final_val_loss"], rel=1e-6)
    assert [r for r in records(sweep / "tiny-review-s0") if r.get("kind") == "diag"]


def test_the_dashboard_in_a_browser(dashboard, chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    responses = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("response", lambda r: responses.append(r) if "/custom_scalars/scalars" in r.url and r.ok else None)
        page.goto(f"http://127.0.0.1:{dashboard}/#custom_scalars", wait_until="networkidle")
        for name in ("tiny/review/seed0", "tiny/standard/seed0", "rr-60m/review/seed0"):
            page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)  # the run selector lists the runs
        page.get_by_text("size tiny", exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("train loss", exact=True).first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(Path(os.environ.get("RRTRAIN_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"),
                        full_page=True)
        # what the "size tiny" train-loss chart drew: the runs whose request for its tag came back with points
        drawn = set()
        for r in responses:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(r.url).query)
            if query.get("tag") == ["^tiny/train_loss$"] and any(r.json().get("tag_to_events", {}).values()):
                drawn.add(query["run"][0])
        browser.close()
    assert drawn == {"tiny/review/seed0", "tiny/standard/seed0"}, drawn



def test_run_names_filter_a_size_or_a_variant_with_one_regex(dashboard):
    """The regexes docs/user-guide.md ("Dashboard") gives for TensorBoard's run filter."""
    runs = get(dashboard, "/data/runs")
    assert {r for r in runs if re.search(r"^tiny/", r)} == {"tiny/review/seed0", "tiny/standard/seed0"}
    assert {r for r in runs if re.search(r"/review/", r)} == {"tiny/review/seed0", "rr-60m/review/seed0"}
    assert {r for r in runs if re.search(r"^rr-60m/standard/", r)} == {"rr-60m/standard/seed0"}


def test_the_hparams_table_shows_variant_size_and_seed_by_default(dashboard, chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{dashboard}/#hparams", wait_until="networkidle")
        table = page.locator("tf-hparams-table-view")
        table.get_by_text("tiny/review/seed0", exact=True).first.wait_for(timeout=60_000)
        shown = {name: table.get_by_text(name, exact=True).first.is_visible()
                 for name in ("variant", "size", "seed")}
        review = table.get_by_text("review", exact=True).first.is_visible()  # the variant column's values
        browser.close()
    assert shown == {"variant": True, "size": True, "seed": True} and review, shown
