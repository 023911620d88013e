#!/usr/bin/env python3
"""Drives headless chromium through its DevTools protocol (websocket-client) over a page written by
`gpumemhook view`, for scripts/check/browser, scripts/bench/view and scripts/pictures.

  browser.py check PAGE REPORT SITE [CEILING]   the page opens with no console error; its
      peak, top module and top site equal the exit report's; clicking the peak shows a flame graph
      whose top frame is SITE's innermost frame; a drag zooms to the range dragged over, the wheel
      zooms in, a double-click shows the whole run again; with CEILING (bytes), the chart says that
      a ceiling of CEILING lies above its range instead of drawing it at the edge
  browser.py job PAGE REPORT...       a page of the processes of one job (`view t.*.trace`, `run
      --html` of several): it opens with no console error; the table of peaks by rank has a row per
      REPORT (exit reports, one per process) with its pid's peak, the highest one marked and named
      above the lanes; the lanes are drawn; clicking each row shows that process's own view below,
      its peak the report's
  browser.py time PAGE                prints the milliseconds to the first view drawn
  browser.py shot PAGE PNG            a 1400x900 screenshot of the page

Exits 1 with the reason when a check fails.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--remote-debugging-port=0", "--window-size=1400,900"]


class Browser:
    """One chromium, one page, its console errors collected."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="gpumemhook-chromium.")
        self.proc = subprocess.Popen(
            [os.environ.get("CHROMIUM", "chromium"), *FLAGS, "--user-data-dir=" + self.profile,
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        for _ in range(300):
            if os.path.exists(port_file) and open(port_file).read().count("\n") >= 1:
                break
            time.sleep(0.05)
        port = open(port_file).read().split("\n")[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self.next_id, self.errors, self.events = 0, [], []
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.note(message)

    def note(self, message):
        method, params = message.get("method"), message.get("params", {})
        self.events.append(method)
        if method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("exception", {}).get("description")
                               or params["exceptionDetails"].get("text"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    def js(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path):
        self.call("Page.navigate", url="file://" + os.path.abspath(path))
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.js("document.body && document.body.dataset.ready === '1'"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{path}: the page did not finish drawing in 60 s ({self.errors})")

    def mouse(self, kind, x, y, **more):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                  buttons=1 if kind != "mouseReleased" else 0, **more)

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        subprocess.run(["rm", "-rf", self.profile], check=False)


def figures(report):
    """The exit report's peak, top module and top site, each by its peak."""
    devices = report["devices"]
    peak = max(d["peak"] for d in devices)
    modules = [m for d in devices for m in d.get("by_module", [])]
    top_module = max(modules, key=lambda m: m.get("peak", 0))["module"] if modules else ""
    sites = report.get("by_site") or []
    top_site = max(sites, key=lambda s: s["peak"])["site"] if sites else ""
    return peak, top_module, top_site


def check(b, page, report_path, site, ceiling=None):
    b.open(page)
    if ceiling is not None:
        above = b.js("document.getElementById('chart').dataset.ceilingAbove || ''").split()
        assert ceiling in above, f"the chart does not say the ceiling {ceiling} is above its range: {above}"
        print(f"browser: the ceiling {ceiling} B is stated above the chart's range, not drawn at its edge")
    shown = b.js("""(() => { const d = id => document.getElementById(id).dataset;
        return {peak: +d('peak').bytes, module: d('top-module').name, site: d('top-site').name}; })()""")
    peak, module, top_site = figures(json.load(open(report_path)))
    want = {"peak": peak, "module": module, "site": top_site}
    assert shown == want, f"the page shows {shown}, the exit report {want}"
    print(f"browser: peak {peak} B, top module {module}, top site {top_site!r}: as the exit report")
    box = b.js("""(() => { const c = document.getElementById('chart'), r = c.getBoundingClientRect();
        return {left: r.left, top: r.top, h: r.height, x: +c.dataset.plotX, w: +c.dataset.plotW}; })()""")
    window = lambda: b.js("(() => { const d = document.getElementById('range').dataset; return [+d.from, +d.to]; })()")
    full = window()
    y = box["top"] + box["h"] / 2
    at = lambda frac: box["left"] + box["x"] + frac * box["w"]
    # Click elsewhere first, then on the peak: the flame graph follows the click.
    b.mouse("mousePressed", at(0.01), y, clickCount=1)
    b.mouse("mouseReleased", at(0.01), y, clickCount=1)
    moved = b.js("+document.getElementById('instant').dataset.t")
    peak_t = b.js("+document.getElementById('peak').dataset.bytes && JSON.parse(document.getElementById('gmh-data').textContent).runs[0].summary.peak_t")
    x = at((peak_t - full[0]) / (full[1] - full[0]))
    b.mouse("mousePressed", x, y, clickCount=1)
    b.mouse("mouseReleased", x, y, clickCount=1)
    instant = b.js("(() => { const i = document.getElementById('instant').dataset, f = document.getElementById('flame').dataset; return {t: +i.t, bytes: +i.bytes, frame: f.topFrame, module: f.topModule}; })()")
    pixel = (full[1] - full[0]) / box["w"]
    assert abs(instant["t"] - peak_t) <= 2 * pixel and moved != instant["t"], (moved, instant, peak_t)
    assert instant["frame"] == site.split(" < ")[0], f"flame graph's top frame {instant['frame']!r}, expected {site!r}"
    assert instant["bytes"] == peak, f"live at the peak {instant['bytes']} B, the peak {peak} B"
    print(f"browser: clicking the peak shows {instant['bytes']} B live, flame graph top frame {instant['frame']!r} ({instant['module']})")
    # Drag over a quarter of the run: that quarter is what shows.
    b.mouse("mousePressed", at(0.25), y)
    b.mouse("mouseMoved", at(0.4), y)
    b.mouse("mouseReleased", at(0.5), y)
    zoomed = window()
    expected = [full[0] + 0.25 * (full[1] - full[0]), full[0] + 0.5 * (full[1] - full[0])]
    assert all(abs(z - e) <= 2 * pixel for z, e in zip(zoomed, expected)), (zoomed, expected)
    b.call("Input.dispatchMouseEvent", type="mouseWheel", x=at(0.5), y=y, deltaX=0, deltaY=-200)
    wheeled = window()
    assert wheeled[1] - wheeled[0] < zoomed[1] - zoomed[0], (wheeled, zoomed)
    b.mouse("mousePressed", at(0.5), y, clickCount=2)
    b.mouse("mouseReleased", at(0.5), y, clickCount=2)
    assert window() == full, (window(), full)
    print(f"browser: drag shows {zoomed} µs of {full}, the wheel {wheeled}, double-click the whole run")
    assert not b.errors, f"console errors: {b.errors}"
    print("browser: no console error")


def check_job(b, page, reports):
    b.open(page)
    peaks = {}
    for path in reports:
        report = json.load(open(path))
        if report["devices"]:  # a launcher that used no GPU has no row
            peaks[report["pid"]] = max(d["peak"] for d in report["devices"])
    rows = b.js("""[...document.querySelectorAll('#ranks tr[data-pid]')].map(r => ({pid: +r.dataset.pid,
        rank: r.dataset.rank, bytes: +r.dataset.bytes, top: r.className === 'top',
        text: [...r.children].map(c => c.textContent)}))""")
    shown = {r["pid"]: r["bytes"] for r in rows}
    assert shown == peaks, f"the table shows peaks {shown}, the exit reports {peaks}"
    for r in rows:
        assert any(t.endswith("B") for t in r["text"]), f"no size written in the row of pid {r['pid']}: {r['text']}"
    highest = max(peaks, key=lambda pid: (peaks[pid], -pid))
    marked = [r["pid"] for r in rows if r["top"]]
    top = b.js("(() => { const d = document.getElementById('job-top').dataset; return {pid: +d.pid, bytes: +d.bytes}; })()")
    assert peaks[marked[0]] == peaks[highest] and top["bytes"] == peaks[highest], (marked, top, peaks)
    print(f"browser: the job's table shows {len(rows)} processes' peaks as their exit reports; "
          f"the highest ({top['bytes']} B, pid {top['pid']}) marked")
    lanes = b.js("(() => { const c = document.getElementById('job-chart'); return [c.width, c.height]; })()")
    assert lanes[0] > 0 and lanes[1] > 60, f"the lanes' canvas is {lanes}"
    for i, r in enumerate(rows):
        b.js(f"document.querySelectorAll('#ranks tr[data-pid]')[{i}].click()")
        sfx = "" if i == 0 else f"-{i + 1}"
        got = b.js(f"""(() => {{ const p = document.getElementById('peak{sfx}'), s = document.getElementById('run{sfx}');
            return {{bytes: +p.dataset.bytes, text: p.textContent, hidden: s.hidden,
              instant: +document.getElementById('instant{sfx}').dataset.t}}; }})()""")
        assert got["bytes"] == r["bytes"] and not got["hidden"], (r, got)
        print(f"browser: rank {r['rank'] or '-'} (pid {r['pid']}): its view shows peak {got['text']} at +{got['instant']} µs")
    assert not b.errors, f"console errors: {b.errors}"
    print("browser: no console error")


def main():
    mode, page = sys.argv[1], sys.argv[2]
    b = Browser()
    try:
        if mode == "check":
            check(b, page, sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
        elif mode == "job":
            check_job(b, page, sys.argv[3:])
        elif mode == "time":
            start = time.time()
            b.open(page)
            drawn = b.js("+document.body.dataset.drawnMs")
            assert not b.errors, f"console errors: {b.errors}"
            print(f"{drawn} ms to the first view (page reported), {1000 * (time.time() - start):.0f} ms until seen ready")
        elif mode == "shot":
            b.call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False)
            b.open(page)
            shot = b.call("Page.captureScreenshot", format="png")
            open(sys.argv[3], "wb").write(base64.b64decode(shot["data"]))
            assert not b.errors, f"console errors: {b.errors}"
        else:
            sys.exit(f"unknown mode {mode}")
    except (AssertionError, RuntimeError) as e:
        sys.exit(f"check/browser.py: FAILED: {e}")
    finally:
        b.close()


if __name__ == "__main__":
    main()
