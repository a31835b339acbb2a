"""`rrtrain dashboard` on a small finished sweep, in a real browser (Debian's chromium driven by Playwright)
and through TensorBoard's HTTP data API; and open while a sweep runs (the live refresh)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from html import unescape
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
    # the HParams session is a run of its own, NAME/STATUS
    val = get(dashboard, "/data/plugin/scalars/scalars", run="tiny/review/seed0/completed", tag="hparams/final_val_loss")
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
            if r.json().get("tag_to_events", {}).get("tiny/train_loss"):  # the chart's regexes: loss and flags
                drawn.add(query["run"][0])
        browser.close()
    assert drawn == {"tiny/review/seed0", "tiny/standard/seed0"}, drawn



def test_run_names_filter_a_size_or_a_variant_with_one_regex(dashboard):
    """The regexes docs/user-guide.md ("Dashboard") gives for TensorBoard's run filter (the HParams sessions,
    NAME/STATUS, go with their run)."""
    every = get(dashboard, "/data/runs")
    assert {r for r in every if re.search(r"^tiny/review/", r)} == {"tiny/review/seed0", "tiny/review/seed0/completed"}
    assert {r for r in every if re.search(r"/seed0\+*$", r)} == {f"{s}/{v}/seed0" for s, v, _ in RUNS}
    runs = [r for r in every if r.rpartition("/")[2].startswith("seed")]
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
        table.get_by_text("tiny/review/seed0/completed", exact=True).first.wait_for(timeout=60_000)
        shown = {name: table.get_by_text(name, exact=True).first.is_visible()
                 for name in ("variant", "size", "seed")}
        review = table.get_by_text("review", exact=True).first.is_visible()  # the variant column's values
        browser.close()
    assert shown == {"variant": True, "size": True, "seed": True} and review, shown


# -- live: the dashboard open while a sweep runs ---------------------------------------------------------------


def _sweep_spec(tmp_path: Path, data: Path) -> Path:
    """Two tiny runs one after the other (local executor, --parallel 1): review trains 60 steps, standard (a
    learning rate of 1e-9) is stopped as stalled at step 8."""
    import yaml

    body = {"name": "live", "config": "tiny.yaml", "data": str(data), "variants": ["review", "standard"],
            "match": "review", "sizes": {"tiny": {"seeds": 1, "overrides": {"train.max_steps": 60}}},
            "overrides": {"train.global_batch": 8, "train.micro_batch": 8, "train.log_every": 1,
                          "train.eval_every": 10, "train.ckpt_every": 0, "data.eval_batches": 1,
                          "model.n_layers": 2},
            "runs": {"tiny-standard-s0": {"train.lr": 1e-9, "train.warmup_steps": 1, "monitor.min_steps": 8,
                                          "monitor.window": 4, "monitor.on_stall": "stop"}},
            "resources": {"time_min": 10, "signal_delay_s": 30}}
    spec = tmp_path / "live.yaml"
    spec.write_text(yaml.safe_dump(body, sort_keys=False))
    return spec


def _chart(page, port: int, size: str) -> dict[str, dict[str, int]]:
    """What the size's train-loss chart drew, per series (`SIZE/train_loss`, `SIZE/flags`): run -> points."""
    drawn: dict[str, dict[str, int]] = {}

    def seen(r) -> None:
        if "/custom_scalars/scalars" not in r.url or not r.ok:
            return
        query = urllib.parse.parse_qs(urllib.parse.urlparse(r.url).query)
        for tag, points in r.json().get("tag_to_events", {}).items():
            if points:
                drawn.setdefault(tag, {})[query["run"][0]] = len(points)

    page.goto("about:blank")  # a fresh load: the app fetches every series again
    page.on("response", seen)
    page.goto(f"http://127.0.0.1:{port}/#custom_scalars", wait_until="networkidle")
    page.get_by_text(f"size {size}", exact=True).first.wait_for(timeout=60_000)
    page.get_by_text("train loss", exact=True).first.wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(1500)
    page.remove_listener("response", seen)
    return drawn


def _signal_tree(proc: subprocess.Popen, sig: int) -> None:
    """Signal a process and everything below it (SIGSTOP holds the sweep still while the first view is taken:
    the test does not depend on how fast this machine trains)."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _hparams_rows(page, port: int, wait: str, names: list[str]) -> dict[str, bool]:
    """Which of `names` the HParams table shows (its session names), once `wait` is shown."""
    page.goto("about:blank")
    page.goto(f"http://127.0.0.1:{port}/#hparams", wait_until="networkidle")
    table = page.locator("tf-hparams-table-view")
    table.get_by_text(wait, exact=True).first.wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    return {n: table.get_by_text(n, exact=True).count() > 0 for n in names}


def test_the_dashboard_follows_a_running_sweep(chromium, stories_data, tmp_path):
    """Opened while the sweep's first run trains: without a restart, the per-size chart grows, the run that
    starts later appears, the stalled run's outcome replaces its HParams row and its flag shows (text, marker,
    the sweep tab, which is `rrtrain status`'s table)."""
    from playwright.sync_api import sync_playwright

    out = tmp_path / "sweep"
    sweep = subprocess.Popen([PY, "-m", "rrtrain", "sweep", str(_sweep_spec(tmp_path, stories_data)), "--out",
                              str(out), "--executor", "local", "--parallel", "1"], cwd=REPO, env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    port = free_port()
    dash = None
    try:
        first = None
        deadline = time.time() + 300
        while first is None:  # the first run has trained a few steps
            assert sweep.poll() is None and time.time() < deadline, "the sweep's first run did not start"
            for run in sorted(out.glob("tiny-*-s0")):
                if len(losses(run)) >= 2:
                    first = run
            time.sleep(0.2)
        _signal_tree(sweep, signal.SIGSTOP)  # held mid-run until the first view is taken
        assert not (first / "final.json").exists()
        second = ({out / "tiny-review-s0", out / "tiny-standard-s0"} - {first}).pop()
        assert not (second / "metrics.jsonl").exists()
        dash = subprocess.Popen([PY, "-m", "rrtrain", "dashboard", str(out), "--port", str(port), "--refresh", "2"],
                                cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        assert "1 runs" in dash.stdout.readline()
        name = {out / "tiny-review-s0": "tiny/review/seed0", out / "tiny-standard-s0": "tiny/standard/seed0"}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            deadline = time.time() + 120
            while True:
                try:
                    if get(port, "/data/runs"):
                        break
                except OSError:
                    pass
                assert dash.poll() is None and time.time() < deadline, "TensorBoard did not come up"
                time.sleep(0.5)
            before = _chart(page, port, "tiny")
            sessions = [f"{n}/{s}" for n in name.values() for s in ("running", "stalled", "completed")]
            rows_before = _hparams_rows(page, port, f"{name[first]}/running", sessions)
            _signal_tree(sweep, signal.SIGCONT)
            assert sweep.wait(timeout=400) is not None
            deadline = time.time() + 60
            while f"{name[out / 'tiny-standard-s0']}/stalled" not in get(port, "/data/runs"):
                assert time.time() < deadline, get(port, "/data/runs")
                time.sleep(1)
            time.sleep(4)  # two refreshes: TensorBoard has read what the last one appended
            after = _chart(page, port, "tiny")
            rows_after = _hparams_rows(page, port, f"{name[out / 'tiny-standard-s0']}/stalled", sessions)
            page.screenshot(path=str(Path(os.environ.get("RRTRAIN_SCREENSHOT_DIR", tmp_path)) / "live.png"),
                            full_page=True)
            browser.close()
        assert dash.poll() is None  # the same TensorBoard throughout
        loss_tag = "tiny/train_loss"
        assert set(before.get(loss_tag, {})) == {name[first]}, (before, after)
        assert after[loss_tag][name[first]] > before[loss_tag][name[first]], (before, after)
        assert name[second] in after[loss_tag], after  # the run that started after the dashboard
        assert after.get("tiny/flags") == {name[out / "tiny-standard-s0"]: 1}, after  # the stall's marker
        assert {n for n, shown in rows_before.items() if shown} == {f"{name[first]}/running"}, rows_before
        # the outcomes replaced the rows: the stalled run's, the completed run's, no running row left
        assert {n for n, shown in rows_after.items() if shown} == {
            f"{name[out / 'tiny-standard-s0']}/stalled", f"{name[out / 'tiny-review-s0']}/completed"}, rows_after
        flags = get(port, "/data/plugin/text/text", run=name[out / "tiny-standard-s0"], tag="flags/text_summary")
        assert len(flags) == 1 and "stalled</strong> at step 8" in flags[0]["text"], flags
        # the sweep tab is the `rrtrain status` table, refreshed: the same text as the command prints now
        html = get(port, "/data/plugin/text/text", run="_sweep", tag="sweep/text_summary")[-1]["text"]
        shown = re.search(r"<pre><code>(.*?)</code></pre>", html, re.S)
        assert shown is not None, html
        from launchers.state import status as status_cli

        status = status_cli.table(status_cli.collect(out))  # what `rrtrain status OUT` prints (its `main`)
        assert unescape(shown.group(1)).rstrip("\n") == status.rstrip("\n"), (shown.group(1), status)
        assert re.search(r"tiny-standard-s0 .* stalled .*stalled", status) and "completed: 1" in status, status
    finally:
        _signal_tree(sweep, signal.SIGCONT)
        kill_group(sweep)
        if dash is not None:
            kill_group(dash)
