"""The student notebooks as a student meets them: JupyterLab in a real browser.

A real ``jupyter lab`` (this venv's) serves copies of the student notebooks on a loopback port
with a random token, with ``LABKIT_RUN_ROOT`` a temporary run root; Playwright drives Debian's
chromium (``/usr/bin/chromium`` through ``executable_path``: no browser is downloaded). For each
``notebooks/NN_*.ipynb``, with its FIXMEs left in place: Run All from the menu, wait for the
kernel, save, then check that no cell shows an error, that every exercise check printed its
"replace FIXME" hint, that every widget rendered and every progress bar reached its end, and that
every figure rendered as an image. After 04, TensorBoard serves the run root. 06's layout
builder runs alone (its title, its parameters and its builder section) and its sliders are
moved. A screenshot and the executed copy of each notebook are kept in ``runs/ci/browser/``
under CI, else in pytest's temporary folder.

By default the browser runs the notebooks that hold every kind of thing a page must render (00's
doctor table, 01's run with its progress bar and figures, 04's profiler and TensorBoard), and
06's layout builder without the runs before it; the others show nothing of a new kind, and the
notebooks tier runs every student notebook headless with its FIXMEs left in
(tests/test_notebooks.py), which checks their outputs.
``LABKIT_BROWSER_SERIES=all`` runs the whole series here too (before a class, say):

    .venv/bin/pytest -m browser -x                                  # checker, 00, 01, 04, builder
    LABKIT_BROWSER_SERIES=all .venv/bin/pytest -m browser -x        # ~ the series' own time
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from conftest import IN_CI, skip_or_fail

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
STUDENT = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# One notebook for each kind of thing a page must render (see the module docstring).
IN_BROWSER = ("00", "01", "04")
BUILDER_NB = next(p for p in STUDENT if p.name.startswith("06"))  # its layout builder, alone
if os.environ.get("LABKIT_BROWSER_SERIES") != "all":
    STUDENT = [p for p in STUDENT if p.name[:2] in IN_BROWSER]
NOTEBOOK_LIMIT_S = float(os.environ.get("LABKIT_BROWSER_NOTEBOOK_TIMEOUT", "900"))
VIEW = {"width": 1400, "height": 1000}
# The settings a fresh JupyterLab gets: every cell attached to the page (so the checks see all
# outputs), the default kernel started without asking, no news pop-up.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none", "autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
}
# One entry per code cell of the open notebook (DOM order = the notebook's cell order).
CELLS_JS = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')].map(c => ({
  code: c.classList.contains('jp-CodeCell'),
  prompt: (c.querySelector('.jp-InputPrompt') || {}).textContent || '',
  outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
    mime: o.getAttribute('data-mime-type') || '', text: o.innerText,
    widget: !!o.querySelector('.jupyter-widgets')})),
  images: [...c.querySelectorAll('.jp-OutputArea-output img')].map(i => i.naturalWidth),
  bars: [...c.querySelectorAll('.widget-progress .progress-bar')].map(b => b.className),
}))"""


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # what the server serves: copies of the notebooks
    run_root: Path
    out: Path
    browser: object

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None


def _first_line(source: str) -> str:
    return next((ln for ln in source.splitlines() if ln.strip() and not ln.startswith("#")),
                source[:60])[:90]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a server this test started: SIGTERM to its process group, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("playwright is not installed (.venv/bin/pip install -e '.[dev]')")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        skip_or_fail("Debian's chromium is not installed (apt-get install chromium)")
    jupyter_lab = Path(sys.executable).with_name("jupyter-lab")
    if not jupyter_lab.exists():
        skip_or_fail(f"{jupyter_lab} is missing (make setup)")
    from labkit.backends.local import free_port

    tmp = tmp_path_factory.mktemp("lab")
    root, run_root = tmp / "notebooks", tmp / "runs"
    root.mkdir()
    run_root.mkdir()
    for nb in STUDENT:  # copies: the repo's notebooks are never written
        shutil.copy(nb, root / nb.name)
    for rel, value in LAB_SETTINGS.items():
        (tmp / "settings" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "settings" / rel).write_text(json.dumps(value))
    if IN_CI:
        out = REPO / "runs" / "ci" / "browser"
        if out.exists():  # an earlier session's screenshots: moved aside, never deleted
            out.rename(out.with_name(f"browser.old-{time.strftime('%Y%m%d-%H%M%S')}"))
        out.mkdir(parents=True)
    else:
        out = tmp_path_factory.mktemp("browser")
    env = {**os.environ, "LABKIT_RUN_ROOT": str(run_root),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for k in ("LABKIT_EXERCISES_STRICT", "LABKIT_METRICS_FILE", "JUPYTER_CONFIG_DIR"):
        env.pop(k, None)
    token, port = secrets.token_hex(16), free_port()
    cmd = [str(jupyter_lab), "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=20",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(out / "jupyterlab.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    # The port is free and outside the ephemeral range now; should something take it before the
    # server binds it, the server moves on (port_retries) and its runtime file names the port.
    runtime = tmp / "runtime" / f"jpserver-{proc.pid}.json"
    try:
        deadline = time.monotonic() + 90
        lab = None
        while True:
            try:
                if lab is None and runtime.exists():
                    url = f"http://127.0.0.1:{json.loads(runtime.read_text())['port']}"
                    lab = Lab(url, token, root, run_root, out, None)
                if lab is not None:
                    lab.api("/api/status")
                    break
            except (OSError, ValueError, KeyError):
                lab = None  # a runtime file half written, or a server not answering yet
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within 90 s (exit code {proc.poll()}, "
                            f"runtime file {runtime}); see {out / 'jupyterlab.log'}")
            time.sleep(0.5)
        with sync_playwright() as pw:
            lab.browser = pw.chromium.launch(executable_path=chromium)
            yield lab
            lab.browser.close()
    finally:
        _stop(proc)
        log.close()


def _click_menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel").filter(has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile(f"^{item}$")).click()


def _kernel(lab: Lab, name: str) -> dict | None:
    return next((s for s in lab.api("/api/sessions") if s["path"] == name), None)


def run_all(lab: Lab, page, name: str, limit_s: float = NOTEBOOK_LIMIT_S):
    """Open ``name``, Run All, wait until the kernel is idle with no cell queued, save.

    Returns (the saved notebook, the DOM's cells, the session id).
    """
    page.goto(f"{lab.url}/lab/workspaces/t{secrets.token_hex(4)}/tree/{name}?token={lab.token}")
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    deadline = time.monotonic() + 120
    while not ((s := _kernel(lab, name)) and s["kernel"]["execution_state"] == "idle"):
        if page.locator(".jp-Dialog").count():  # a kernel chooser, should one appear anyway
            page.locator(".jp-Dialog .jp-mod-accept").click()
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: the kernel did not start within 120 s")
        time.sleep(1)
    sid = s["id"]
    _click_menu(page, "Run", "Run All Cells")
    nb = nbformat.read(lab.root / name, as_version=4)
    t0, idle_polls = time.monotonic(), 0
    while idle_polls < 2:
        time.sleep(2)
        cells = page.evaluate(CELLS_JS)
        started = any(re.search(r"\[\d+\]", c["prompt"]) for c in cells)
        busy = [i for i, c in enumerate(cells) if "*" in c["prompt"]]
        idle = _kernel(lab, name)["kernel"]["execution_state"] == "idle"
        idle_polls = idle_polls + 1 if started and idle and not busy else 0
        if time.monotonic() - t0 > limit_s:
            shot = lab.out / f"{Path(name).stem}.timeout.png"
            page.screenshot(path=str(shot))
            done = [i for i, c in enumerate(cells) if re.search(r"\[\d+\]", c["prompt"])]
            running = f"cell {busy[0]} ({_first_line(nb.cells[busy[0]].source)})" if busy else "none"
            last = f"cell {done[-1]} ({_first_line(nb.cells[done[-1]].source)})" if done else "none"
            pytest.fail(f"{name}: not finished after {limit_s:.0f} s; running: {running}; last "
                        f"executed: {last}; screenshot {shot}")
    before = (lab.root / name).stat().st_mtime_ns
    _click_menu(page, "File", "Save Notebook")
    deadline = time.monotonic() + 30
    while (lab.root / name).stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            pytest.fail(f"{name}: JupyterLab did not save the notebook within 30 s")
        time.sleep(0.5)
    time.sleep(0.5)
    return nbformat.read(lab.root / name, as_version=4), page.evaluate(CELLS_JS), sid


def problems(nb, cells: list[dict], *, student: bool = True) -> list[str]:
    """What a student would see go wrong, one line each (empty: all good)."""
    out: list[str] = []
    if len(cells) != len(nb.cells):
        return [f"the page shows {len(cells)} cells, the notebook has {len(nb.cells)}"]
    for i, (cell, dom) in enumerate(zip(nb.cells, cells, strict=True)):
        if cell.cell_type != "code":
            continue
        where = f"cell {i} ({_first_line(cell.source)})"
        if cell.get("execution_count") is None:
            out.append(f"{where}: not executed (Run All stopped before it)")
            continue
        text = "\n".join(o["text"] for o in dom["outputs"])
        for o in cell.outputs:
            if o.output_type == "error":
                out.append(f"{where}: {o.ename}: {o.evalue}")
        if student and "= FIXME  # EXERCISE" in cell.source and "replace FIXME" not in text:
            out.append(f"{where}: the exercise check printed no 'replace FIXME' hint")
        n_png = sum("image/png" in o.get("data", {}) for o in cell.outputs)
        if "plt.show()" in cell.source and not n_png:
            out.append(f"{where}: draws a figure but shows no image")
        if sum(w > 0 for w in dom["images"]) < n_png:
            out.append(f"{where}: {n_png} figure(s) in the outputs, {len(dom['images'])} image(s) "
                       f"rendered (widths {dom['images']})")
        if m := re.search(r"<Figure size [^>]*>", text):
            out.append(f"{where}: a figure shown as text {m.group(0)!r}, not as an image")
        for o in dom["outputs"]:
            if "widget-view" in o["mime"] and not o["widget"]:
                out.append(f"{where}: a widget did not render: {o['text'][:120]!r}")
        for bar in dom["bars"]:
            if "progress-bar-success" not in bar:
                out.append(f"{where}: a progress bar did not reach its end ({bar})")
        for o in dom["outputs"]:  # tqdm's text fallback: the last state shown must be 100%
            if (pcts := re.findall(r"(\d+)%\|", o["text"])) and pcts[-1] != "100":
                out.append(f"{where}: a text progress bar ended at {pcts[-1]}%")
    return out


def screenshot(page, path: Path) -> None:
    """The whole notebook in one picture: the viewport grown to the notebook's height."""
    h = page.evaluate("() => Math.max(...[...document.querySelectorAll("
                      "'.jp-NotebookPanel .jp-WindowedPanel-outer')].map(e => e.scrollHeight), 0)")
    page.set_viewport_size({"width": VIEW["width"], "height": int(min(max(h + 200, 600), 16000))})
    page.evaluate("() => document.querySelectorAll('.jp-NotebookPanel .jp-WindowedPanel-outer')"
                  ".forEach(e => { e.scrollTop = 0; })")
    page.wait_for_timeout(500)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEW)


# --- the checker itself can fail --------------------------------------------------------------
def test_the_checker_catches_a_broken_notebook(lab):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell(s) for s in (
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        "from labkit.exercises import FIXME, check_world_size\n"
        "world_size = FIXME  # EXERCISE\ncheck_world_size(world_size, nodes=2, gpus_per_node=2)",
        "print(repr(plt.figure()))\nplt.close('all')",
        "raise ValueError('a broken cell')",
        "print('never runs')")]
    nbformat.write(nb, lab.root / "zz_checker.ipynb")
    page = lab.browser.new_page(viewport=VIEW)
    try:
        saved, cells, sid = run_all(lab, page, "zz_checker.ipynb", limit_s=180)
        lab.api(f"/api/sessions/{sid}", method="DELETE")
    finally:
        page.close()
    found = problems(saved, cells)
    assert len(found) == 3, found
    assert "cell 2" in found[0] and "<Figure size" in found[0]
    assert "cell 3" in found[1] and "ValueError: a broken cell" in found[1]
    assert "cell 4" in found[2] and "not executed" in found[2]
    assert cells[0]["images"] and cells[0]["images"][0] > 0  # the real figure did render


# --- the series ---------------------------------------------------------------------------------
@pytest.mark.timeout(NOTEBOOK_LIMIT_S + 600)
@pytest.mark.parametrize("path", STUDENT, ids=lambda p: p.stem[:2])
def test_student_notebook_runs_in_jupyterlab(path, lab):
    if not (REPO / "data" / "corpus_text_document.idx").exists():
        pytest.fail("no dataset: run `make data` (code/prepare_data.py) first")
    page = lab.browser.new_page(viewport=VIEW)
    sid = None
    try:
        nb, cells, sid = run_all(lab, page, path.name)
        shutil.copy(lab.root / path.name, lab.out / path.name)  # the executed copy
        screenshot(page, lab.out / f"{path.stem}.png")
        found = problems(nb, cells)
        assert not found, f"{path.name} in JupyterLab (screenshot {lab.out / path.stem}.png):\n  " \
                          + "\n  ".join(found)
        if path.name.startswith("06"):
            check_layout_builder(page, lab)
        if path.name.startswith("04"):
            check_tensorboard(page, lab, nb)
    finally:
        if sid:
            lab.api(f"/api/sessions/{sid}", method="DELETE")  # frees the kernel's memory
        page.close()


def test_layout_builder_in_jupyterlab(lab):
    """06's section "Explore layouts live" as a student meets it: the notebook's title, its
    parameters and that section, run in JupyterLab; then the sliders are moved. (The whole of 06
    trains five runs first; the notebooks tier runs it headless, LABKIT_BROWSER_SERIES=all here.)"""
    nb = nbformat.read(BUILDER_NB, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "layout_builder(" in c.source)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    nb.cells = [nb.cells[0], params, nb.cells[at - 1], nb.cells[at]]
    assert nb.cells[2].cell_type == "markdown", "06's builder cell lost its heading"
    name = f"{BUILDER_NB.stem}.builder.ipynb"
    nbformat.write(nb, lab.root / name)
    page = lab.browser.new_page(viewport=VIEW)
    sid = None
    try:
        saved, cells, sid = run_all(lab, page, name)
        found = problems(saved, cells)
        assert not found, f"{name} in JupyterLab:\n  " + "\n  ".join(found)
        check_layout_builder(page, lab)
    finally:
        if sid:
            lab.api(f"/api/sessions/{sid}", method="DELETE")
        page.close()


def check_layout_builder(page, lab: Lab) -> None:
    """Move 06's sliders as a student does (type into the readout, Enter) and read the panel."""
    from labkit.config import RunConfig
    from labkit.errors import ConfigError

    builder = page.locator(".labkit-layout-builder")
    assert builder.count() == 1, "06 shows no layout builder"
    panel = builder.locator(".labkit-layout-panel")

    def move(label: str, value: float, expect: str) -> str:
        before = panel.inner_text()
        slider = builder.locator(".widget-slider").filter(
            has=page.locator(".widget-label", has_text=re.compile(f"^{label}$")))
        readout = slider.locator(".widget-readout")
        readout.click()
        page.keyboard.press("Control+a")
        page.keyboard.type(str(value))
        page.keyboard.press("Enter")
        deadline = time.monotonic() + 30
        while (text := panel.inner_text()) == before or expect not in text:
            if time.monotonic() > deadline:
                pytest.fail(f"06: {label} -> {value}: the panel did not show {expect!r}:\n{text}")
            time.sleep(0.3)
        return text

    first = panel.inner_text()
    assert "TP=1 x PP=1" in first and "fits" in first and "does NOT fit" not in first, first
    move("TP", 2, "TP=2 x PP=1")
    text = move("PP", 2, "TP=2 x PP=2 x DP=1")
    assert "fits" in text and "does NOT fit" not in text, text
    move("GB per rank", 0.001, "does NOT fit")
    text = move("TP", 3, "Invalid layout")
    defaults = RunConfig.for_profile("cpu")
    try:
        RunConfig.for_profile("cpu", nodes=2, gpus_per_node=2, tensor_model_parallel_size=3,
                              pipeline_model_parallel_size=2, gpu_memory_gb=0.001,
                              micro_batch_size=defaults.micro_batch_size,
                              global_batch_size=defaults.global_batch_size)
        pytest.fail("TP=3 on 4 ranks should be a ConfigError")
    except ConfigError as e:
        missing = [v for v in e.violations if v not in text]
    assert not missing, f"06: the builder does not show the ConfigError's {missing}:\n{text}"
    builder.screenshot(path=str(lab.out / "06_layout_builder.png"))


def check_tensorboard(page, lab: Lab, nb) -> None:
    """TensorBoard on the run root that 04 prints: its API and its page list the run's scalars."""
    from labkit.measured.tb import tensorboard_command

    printed = "\n".join(str(o.get("text", "")) for c in nb.cells if c.cell_type == "code"
                        and "tensorboard_command_line(" in c.source for o in c.outputs)
    # The server runs with LABKIT_RUN_ROOT=lab.run_root: the command names the variable, so a
    # student can paste it; no absolute path of this machine is printed.
    assert '--logdir "$LABKIT_RUN_ROOT"' in printed and str(lab.run_root) not in printed, \
        f"04 does not print a TensorBoard command on $LABKIT_RUN_ROOT: {printed!r}"
    runs = sorted({p.parent.relative_to(lab.run_root).as_posix()
                   for p in lab.run_root.rglob("*tfevents*")})  # TensorBoard's run names
    assert runs, f"no run under {lab.run_root} wrote TensorBoard events"
    # Port 0: TensorBoard binds a port the kernel gives it, once, and prints its address.
    log = open(lab.out / "tensorboard.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(tensorboard_command(lab.run_root, port=0, host="127.0.0.1"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = None
    try:
        deadline, tags = time.monotonic() + 120, {}
        while not set(runs) <= set(tags):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"TensorBoard on {lab.run_root} lists {sorted(tags)} within 120 s, "
                            f"not all of {runs}; see {lab.out / 'tensorboard.log'}")
            time.sleep(2)
            if url is None:
                m = re.search(r"at (http://127\.0\.0\.1:\d+)/", (lab.out / "tensorboard.log").read_text())
                url = m and m.group(1)
                continue
            try:
                with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=10) as r:
                    tags = json.loads(r.read())
            except OSError:
                pass
        assert all("lm-loss" in tags[r] for r in runs), tags
        page.goto(f"{url}/#timeseries")
        for r in runs:  # the runs table of the page
            page.get_by_text(r, exact=True).first.wait_for(timeout=60_000)
        page.get_by_text("lm-loss", exact=True).first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(lab.out / "04_tensorboard.png"))
    finally:
        _stop(proc)
        log.close()
