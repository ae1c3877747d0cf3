"""The dashboard in a real browser: `streamlit run app.py` driven by Playwright in /usr/bin/chromium.

Screenshots go to pytest's temporary directory; the README's (docs/decode.png, profile.png, compare.png,
report.png) are refreshed only on request: `DDTREE_REFRESH_DOCS=1 python -m pytest tests/test_browser.py`.
The test also checks the app is offline: every request the page makes goes to the local server. CI installs
Debian's chromium (.ci/run), so there this test fails rather than skips when the browser is missing.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM = pathlib.Path("/usr/bin/chromium")
DOCS = ROOT / "docs"
REFRESH_DOCS = os.environ.get("DDTREE_REFRESH_DOCS") == "1"
STARTUP_S = 120
PAGE_UPDATE_S = 0.5  # issue 28's aim for what a step's click costs beyond the engine's step (median), printed
MAX_PAGE_UPDATE_S = 1.2  # asserted: on a busy 2-core machine the median ran 0.4-0.75 s (1.7-2 s before the fix)
RUN_S = 600_000  # ms Playwright waits for a rerun: the first decode in a fresh checkout builds the kernels

pytestmark = pytest.mark.browser


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: pathlib.Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"streamlit did not report healthy within {STARTUP_S} s:\n{log.read_text()[-3000:]}")


def serve(tmp_path_factory, launcher: list[str], env: dict[str, str] | None = None):
    """Start `streamlit run app.py` (through launcher) on a free port; yields its URL and stops it after."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium before the tests")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI always runs this test")
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*launcher, "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
             "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory, [sys.executable, "-m", "streamlit", "run", "app.py"])


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> pathlib.Path:
    """Where the screenshots go: docs/ when refreshing them, else a temporary directory."""
    return DOCS if REFRESH_DOCS else tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def requested_hosts() -> set[str]:
    """The host of every http(s)/ws(s) request the page makes."""
    return set()


def launch(pw):
    """Chromium as every test here runs it: headless, offline."""
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])


@pytest.fixture(scope="module")
def pw():
    """One Playwright for the module: a second sync_playwright inside the first refuses to start."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=RUN_S)
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def page(pw, server, requested_hosts):
    browser = launch(pw)
    context = browser.new_context(viewport={"width": 1440, "height": 1600}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(RUN_S)
    page.on("request", lambda request: requested_hosts.add(host(request.url)))
    page.goto(server)
    yield page
    browser.close()


def host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.netloc if parts.scheme in ("http", "https", "ws", "wss") else "local"  # data:, blob:


STEP_SHOWN = """steps => {
    const shown = [...document.querySelectorAll('[data-testid="stMarkdownContainer"] p')].some(
        p => p.innerText.startsWith(`Step ${steps - 1}: tree of`));
    const metric = [...document.querySelectorAll('[data-testid="stMetric"]')].find(
        m => m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim() === "Steps");
    return shown && metric?.querySelector('[data-testid="stMetricValue"]').innerText.trim() === String(steps);
}"""  # the page shows step `steps`: its tree's caption and the Steps count (checked on every frame)


def metric(page, label: str):
    return page.locator('[data-testid="stMetric"]').filter(
        has=page.get_by_text(label, exact=True)).locator('[data-testid="stMetricValue"]')


def settle(page) -> None:
    """Wait until Streamlit has finished the current rerun."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden")


def tree_data(page) -> str:
    from playwright.sync_api import expect

    chart = page.locator(".st-key-tree .js-plotly-plot")
    expect(chart).to_have_count(1)  # a rerun briefly keeps the previous run's chart beside the new one
    return chart.evaluate("el => JSON.stringify(el.data)")


def shot(page, where: pathlib.Path, name: str) -> None:
    """Screenshot the whole page: Streamlit scrolls inside a container, so grow the viewport to the content."""
    settle(page)
    size = page.viewport_size
    height = page.locator('[data-testid="stMainBlockContainer"]').evaluate("el => el.scrollHeight")
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(height + 80, 8000))})
    page.wait_for_timeout(800)  # plotly charts re-lay out to the new size
    where.mkdir(exist_ok=True)
    page.screenshot(path=str(where / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def open_page(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True).click()
    page.get_by_role("heading", name=title, level=1).wait_for()


def test_step_in_the_browser_then_download_the_report(page, server, shots, requested_hosts):
    from playwright.sync_api import expect

    expect(metric(page, "Steps")).to_have_text("0")
    step = page.get_by_role("button", name="Step", exact=True)
    trees, beyond_engine_s = [], []
    for num_steps in (1, 2, 3, 4, 5):
        clicked = time.monotonic()
        step.click()
        page.wait_for_function(STEP_SHOWN, arg=num_steps, polling="raf", timeout=RUN_S)  # each frame, no back-off
        shown_s = time.monotonic() - clicked
        expect(page.get_by_text(re.compile(rf"^Step {num_steps - 1}: tree of \d+ nodes"))).to_be_visible()
        step_ms = float(metric(page, "Step time").inner_text().removesuffix(" ms"))
        if num_steps > 1:  # the first click also loads the model and prefills
            beyond_engine_s.append(shown_s - step_ms / 1e3)
        settle(page)
        trees.append(tree_data(page))
    assert trees[0] != trees[2], "the tree figure follows the newest step"
    median = sorted(beyond_engine_s)[len(beyond_engine_s) // 2]
    print(f"page update beyond the engine's step: median {median:.3f} s of {[round(s, 3) for s in beyond_engine_s]} "
          f"(aim: under {PAGE_UPDATE_S} s)")
    assert median < MAX_PAGE_UPDATE_S, f"a click costs {median:.3f} s beyond the engine's step: {beyond_engine_s}"
    expect(page.get_by_text(re.compile(r"^Step 4: tree of \d+ nodes"))).to_be_visible()
    chips = page.locator('[data-testid="stHtml"] span[title^="id "]')
    tokens = [int(chips.nth(i).get_attribute("title").split()[1]) for i in range(chips.count())]
    assert tokens, "the committed tokens show as chips, their ids on hover"
    shot(page, shots, "decode")

    open_page(page, "Profile")
    expect(page.get_by_text(re.compile("^Nothing measured yet"))).to_be_visible()
    page.get_by_role("button", name="Measure", exact=True).click()
    expect(metric(page, "DDTree tokens/s")).to_have_text(re.compile(r"^\d+\.\d$"))
    expect(page.get_by_text(re.compile(r"^\d+\.\d\dx speedup, tau \d+\.\d\d$"))).to_be_visible()
    page.get_by_role("button", name=re.compile("Run sweep")).click()
    # the sweep's verdict: a clear fastest budget, or the budgets its repeats cannot separate
    expect(page.get_by_text(re.compile(r"^(Fastest|No clear fastest): B = (\d+|auto:\d+)"))).to_be_visible()
    shot(page, shots, "profile")

    open_page(page, "Compare")
    expect(page.get_by_text(re.compile("^Greedy-exact: DDTree emitted exactly the AR tokens"))).to_be_visible()
    shot(page, shots, "compare")

    open_page(page, "Report")
    download_button = page.locator('[data-testid="stDownloadButton"]').filter(has_text="report.json")
    with page.expect_download() as download:
        download_button.click()
    assert download.value.suggested_filename == "report.json"
    summary = json.loads(pathlib.Path(download.value.path()).read_text())["summaries"]["ddtree"]
    shot(page, shots, "report")
    assert summary["matches_ar"] is True
    assert summary["tokens"][: len(tokens)] == tokens, "the report decodes what the Decode page showed"
    if len(tokens) == summary["num_generated"]:  # five steps finished the decode on the Decode page
        assert summary["num_steps"] == 5
    else:
        assert summary["num_steps"] > 5

    # the downloaded report opens as a recording: labelled on every page, its steps replayed without the model
    path_box = page.get_by_role("textbox", name="Or a report path")
    path_box.fill(str(download.value.path()))
    path_box.press("Enter")
    recording = page.get_by_text("not a live decode")
    expect(recording).to_be_visible()
    open_page(page, "Decode")
    expect(recording).to_be_visible()
    expect(metric(page, "Steps")).to_have_text("0")
    page.get_by_role("button", name="Step", exact=True).click()
    expect(metric(page, "Steps")).to_have_text("1")
    expect(page.get_by_text(re.compile(r"^Step 0: tree of \d+ nodes"))).to_be_visible()
    open_page(page, "Profile")
    expect(recording).to_be_visible()
    expect(page.get_by_role("button", name="Measure again")).to_be_disabled()
    page.get_by_role("button", name="Close the recording").click()
    expect(recording).to_have_count(0)
    local = urllib.parse.urlsplit(server).netloc
    assert requested_hosts <= {local, "local"}, f"requests left the machine: {sorted(requested_hosts - {local})}"


def figure(page, key: str) -> dict:
    from playwright.sync_api import expect

    chart = page.locator(f".st-key-{key} .js-plotly-plot")
    expect(chart).to_have_count(1)
    return json.loads(chart.evaluate("el => JSON.stringify({data: el.data, layout: el.layout})"))


def test_capture_with_the_profiler_then_read_a_1024_node_tree(page, server, requested_hosts):
    from playwright.sync_api import expect

    open_page(page, "Profile")  # the tab measured in the test before: Measure again, the page keeps working
    page.get_by_role("button", name=re.compile(r"^Measure( again)?$")).click()
    settle(page)
    expect(page.get_by_role("button", name="Stop", exact=True)).to_have_count(0)  # the background job ended
    expect(metric(page, "DDTree tokens/s")).to_have_text(re.compile(r"^\d+\.\d$"))  # the repeats are measured
    settle(page)
    page.get_by_role("button", name="Capture with torch.profiler").click()
    expect(page.get_by_text(re.compile(r"^A CPU capture: no device kernels"))).to_be_visible()
    expect(page.get_by_text("Captured run", exact=True)).to_be_visible()

    open_page(page, "Decode")
    budget = page.get_by_role("spinbutton", name="Budget B (tree nodes)")
    budget.fill("1024")
    budget.press("Enter")
    settle(page)
    page.get_by_role("button", name="Step", exact=True).click()
    expect(metric(page, "Steps")).to_have_text("1")
    settle(page)
    ladder = figure(page, "tree")
    assert re.search(r"\(\d+ of 1025 nodes shown\)", ladder["layout"]["title"]["text"])
    labels = ladder["data"][-1]
    sibling = next(i for i, node in enumerate(labels["customdata"]) if node > 0 and "#" in labels["text"][i]
                   and i > 1)
    node = labels["customdata"][sibling]
    box = page.locator(".st-key-tree .js-plotly-plot .scatterlayer .trace").last.locator(".point").nth(sibling)
    box.click(force=True)  # a click on a box focuses the ladder on its node
    expect(page.locator(".st-key-tree .gtitle").filter(has_text=f"focus on node {node} ")).to_be_visible()
    settle(page)
    assert f"focus on node {node} " in figure(page, "tree")["layout"]["title"]["text"]
    mask = figure(page, "mask")
    assert str(node) in mask["data"][0]["y"], "the mask shows the focus's row"
    assert "1025 nodes" in figure(page, "tree_overview")["layout"]["title"]["text"]
    local = urllib.parse.urlsplit(server).netloc
    assert requested_hosts <= {local, "local"}, f"requests left the machine: {sorted(requested_hosts - {local})}"


SLOW_FIRST_LOAD_S = 6  # the first checkpoint load: the build's status fragment polls (and its build ends) meanwhile
SLOW_PREFILL_S = 3  # every prefill: long enough to see the page while a step's run is under way
CPU_THROTTLE = 4  # the first tab's browser as slow as on a busy machine: the sidebar mounts late


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    yield from serve(tmp_path_factory, [sys.executable, "tests/slow_start.py"],
                     {"DDTREE_TEST_FIRST_LOAD_S": str(SLOW_FIRST_LOAD_S), "DDTREE_TEST_PREFILL_S": str(SLOW_PREFILL_S)})


def sidebar_value(page, role: str, label: str) -> str:
    return page.locator('[data-testid="stSidebar"]').get_by_role(role, name=label, exact=True).input_value()


def test_a_fresh_servers_first_tab_keeps_its_settings_and_one_row_of_controls(slow_server, pw):
    """The first tab of a fresh server, on a slow first run: the sidebar shows the settings the page decodes with
    (once it showed every number at its minimum and the first Step committed them), and a step's run after a settings
    change shows one row of controls (the notice above them once shifted the page, and the old row stayed, faded)."""

    browser = launch(pw)
    try:
        _first_tab_checks(browser, slow_server)
    finally:
        browser.close()


def _first_tab_checks(browser, slow_server: str) -> None:
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1440, "height": 1600})
    page.set_default_timeout(RUN_S)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": CPU_THROTTLE})
    page.goto(slow_server)
    expect(metric(page, "Steps")).to_have_text("0")
    expect(page.get_by_text("Building the DDTree kernels", exact=False)).to_have_count(0)
    page.wait_for_timeout(4000)  # the status fragment's last polls
    settle(page)
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
    caption = page.get_by_text(re.compile(r"B = \d+, block size \d+")).inner_text()
    budget, block_size = re.search(r"B = (\d+), block size (\d+)", caption).groups()
    shown = {"budget": sidebar_value(page, "spinbutton", "Budget B (tree nodes)"),
             "block size": sidebar_value(page, "spinbutton", "Block size"),
             "prompt": sidebar_value(page, "textbox", "Prompt text")}
    assert (shown["budget"], shown["block size"]) == (budget, block_size), (shown, caption)
    assert shown["prompt"], "the prompt box holds the model's first example prompt"
    step = page.get_by_role("button", name="Step", exact=True)
    step.click()
    expect(metric(page, "Steps")).to_have_text("1")
    assert f"budget={budget}&" in page.url, page.url
    expect(page.get_by_text(re.compile("^Settings changed"))).to_have_count(0)

    box = page.get_by_role("spinbutton", name="Budget B (tree nodes)")
    box.fill("16")
    box.press("Enter")
    expect(page.get_by_text(re.compile("^Settings changed"))).to_be_visible()
    settle(page)
    step.click()
    rows = []
    while page.get_by_text(re.compile(r"^Step 0: tree of")).count() == 0:
        rows.append(step.count())
        page.wait_for_timeout(100)
    assert rows and max(rows) == 1, f"rows of controls during the step's run: {rows}"
