"""The demo's incident report, from one real 2-rank demo run: the opening table of faults, Markdown and HTML.

The demo runs as the real ``trainhealth demo`` command on free ports (its ranks' rendezvous port is picked
free by the demo itself); the page is opened in headless Chromium (the Debian package, which .ci/run
installs) through Playwright. The demo calibrates its steps to its duration, so this takes about a minute.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.prometheus_server import require_binary
from trainhealth._internal.demo.story import TABLE_HEADER, Detection, match
from trainhealth._internal.faults import Fault
from trainhealth._internal.injectors.schedule_file import load_schedule

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


def _free_ports(count: int) -> list[int]:
    """``count`` free ports, each with its successor free too (rank r serves on port base + r)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        ports.append(port)
    return ports


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "run"
    (port_base,) = _free_ports(1)
    done = subprocess.run(
        [
            TRAINHEALTH,
            "demo",
            "--duration",
            "40",
            "--ranks",
            "2",
            "--out",
            str(out),
            "--port-base",
            str(port_base),
            "--no-analyzer",
            "--webhook-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (out / "stdout.txt").write_text(done.stdout)
    return out


def _report(demo: Path) -> dict[str, Any]:
    return dict(json.loads((demo / "report.json").read_text()))


def _markdown_rows(text: str) -> list[list[str]]:
    """The rows of the first Markdown table after its header."""
    lines = text.split("\n")
    start = lines.index("| " + " | ".join(TABLE_HEADER) + " |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_matching_by_rank_family_and_window() -> None:
    spike, throttle = load_schedule(
        [
            {"kind": "lr_scale", "severity": 30, "step": 50, "until": 54},  # every rank
            {"kind": "simulated_gpu", "fault": "thermal_throttle", "gpu": 1, "step": 10, "ranks": [1]},
        ]
    )
    seen = [
        Detection("event", "anomaly on loss", "numerics", 0, 51),
        Detection("event", "anomaly on loss", "numerics", 1, 90),  # after until + grace
        Detection("event", "gpu.xid", "gpu-error", 1, 60),  # an error, not a throttle
        Detection("telemetry", "SM clock", "gpu-clock", 1, 12),
        Detection("page", "GPUThrottled", "any", 1, 200),
    ]
    assert [(d.what, d.step) for d in match(spike, seen, last_step=300)] == [("anomaly on loss", 51)]
    # a throttle without ``until`` lasts: its window runs to the end of the run
    assert [(d.source, d.step) for d in match(throttle, seen, last_step=300)] == [("telemetry", 12), ("page", 200)]
    assert match(throttle, seen, last_step=100) == [Detection("telemetry", "SM clock", "gpu-clock", 1, 12)]
    [delay] = load_schedule([{"kind": "delay", "severity": 1, "step": 5, "until": 9, "ranks": [0]}])
    assert match(delay, seen, last_step=300) == []


def test_every_injected_fault_is_in_the_table_verdict_and_advice(demo: Path) -> None:
    report = _report(demo)
    schedule, findings = report["schedule"], report["findings"]
    assert [f["kind"] for f in schedule] == ["simulated_gpu", "delay", "lr_scale", "simulated_gpu"]
    assert [f"step {f['step']}" for f in schedule] == [row["injected"] for row in findings]
    markdown = (demo / "report.md").read_text()
    for row in findings:
        assert row["first detection"] and row["delay"] and row["advice"] not in ("", "-")
    xid, throttle, spike = findings[3], findings[0], findings[2]
    assert "XID 79 (GPU has fallen off the bus): reboot the machine" in xid["advice"]
    assert "cooling" in throttle["advice"] and "Restore the checkpoint" in spike["advice"]
    verdict = markdown.split("## Verdict", 1)[1].split("## ", 1)[0]
    todo = markdown.split("## What to do", 1)[1].split("## ", 1)[0]
    for fault in report["faults"]:
        assert fault in verdict and fault in todo
    evidence = markdown.split("## The localizer's evidence", 1)[1].split("## ", 1)[0]
    for suspect in (report["localization"] or {}).get("suspects", []):
        assert suspect["evidence"] in evidence


def test_the_straggler_the_run_had_is_in_the_verdict_printed_and_reported(demo: Path) -> None:
    """Issue 49: the demo's straggler (rank 1, from its delay to the delay's end) is named as a fault now or as
    the run's past ("healthy now; in this run: ..."), the same words in the terminal and in the report; a
    bare "healthy" beside it fails."""
    report = _report(demo)
    loc = report["localization"]
    (delay,) = [f for f in report["schedule"] if f["kind"] == "delay"]
    named = [s.get("component") for s in loc["suspects"]] + [p["component"] for p in loc.get("in_this_run", [])]
    assert f"gpu:rank-{delay['ranks'][0]}" in named, loc
    if not loc["suspects"]:
        assert loc["verdict"] in ("healthy", "insufficient_data")
        assert "; in this run: gpu:rank-" in _verdict_line((demo / "report.md").read_text())
    printed = [line for line in (demo / "stdout.txt").read_text().splitlines() if line.startswith("verdict: ")]
    assert printed and printed[-1].split(";  top suspect")[0].startswith(
        "verdict: " + _verdict_line((demo / "report.md").read_text())
    ), printed


def _verdict_line(markdown: str) -> str:
    """The localizer's verdict as the report's Markdown gives it."""
    return markdown.split("Localizer: **", 1)[1].split("**", 1)[0]


def test_markdown_table_has_the_rows_of_the_json_and_the_page(demo: Path) -> None:
    rows = [[row[h] for h in TABLE_HEADER] for row in _report(demo)["findings"]]
    assert _markdown_rows((demo / "report.md").read_text()) == rows
    page = (demo / "report.html").read_text()
    first_table = page.split('<table id="faults">', 1)[1].split("</table>", 1)[0]
    import html

    cells = [
        [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)]
        for tr in re.findall(r"<tr>(.*?)</tr>", first_table)
        if "<td>" in tr
    ]
    assert cells == rows
    assert page.index('<table id="faults">') == page.index("<table")  # the page opens with it


def test_the_page_renders_in_chromium(demo: Path) -> None:
    chromium = require_binary("chromium")  # CI (TRAINHEALTH_REQUIRE_BINARIES) fails instead of skipping
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    report = _report(demo)
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.goto((demo / "report.html").resolve().as_uri(), wait_until="load")
            images = page.eval_on_selector_all(
                "img",
                """images => images.map(image => {
                const box = image.getBoundingClientRect();
                return {src: image.getAttribute("src"), natural: image.naturalWidth, width: box.width,
                        height: box.height};
            })""",
            )
            table = page.eval_on_selector(
                "table",
                """table => Array.from(table.rows).map(
                row => Array.from(row.cells).map(cell => cell.innerText.trim()))""",
            )
        finally:
            browser.close()
    assert problems == []
    assert {image["src"] for image in images} >= {"timeline.png", "loss.png", "step_times.png", "gpus.png"}
    for image in images:
        assert image["natural"] > 0 and image["width"] > 0 and image["height"] > 0, image
    assert table[0] == list(TABLE_HEADER)
    assert [row[2] for row in table[1:]] == [f"step {fault['step']}" for fault in report["schedule"]]
    assert [row[0] for row in table[1:]] == [row["fault"] for row in report["findings"]]


def test_the_demo_prints_its_wall_time_and_the_report_carries_it(demo: Path) -> None:
    wall = _report(demo)["wall_s"]
    assert wall > 40  # the training alone is 40 s
    printed = re.search(r"wall time: (\d+) s", (demo / "stdout.txt").read_text())
    # printed after the report is written: on a busy machine writing it takes a few seconds of the total
    assert printed is not None and abs(int(printed.group(1)) - wall) <= max(2.0, 0.1 * wall)
    assert f"the demo took {wall:.0f} s" in (demo / "report.md").read_text()


def test_false_alarms_are_the_detections_no_fault_explains(demo: Path) -> None:
    from trainhealth._internal.demo import story

    report = _report(demo)
    histories = {
        int(p.stem.split("-")[1]): json.loads(p.read_text())["steps"] for p in (demo / "history").glob("rank-*.json")
    }
    found = story.detections(report["events"], histories, report["pages"], report["localization"], report["verdicts"])
    last_step = max(r["step"] for rows in histories.values() for r in rows)
    schedule = [Fault.from_dict(fault) for fault in report["schedule"]]  # report.json holds the schedule's entries
    explained = {id(d) for fault in schedule for d in story.match(fault, found, last_step)}
    expected = [(d.what, d.rank, d.step) for d in found if id(d) not in explained]
    assert sorted(expected, key=str) == sorted(
        ((a["what"], a["rank"], a["step"]) for a in report["false_alarms"]), key=str
    )
    page = (demo / "report.html").read_text()
    listed = re.search(r'<ul id="false-alarms">(.*?)</ul>', page, re.S)
    assert listed is not None and listed.group(1).count("<li>") == len(expected)
    assert f"Detections that no injected fault explains: {len(expected)}." in (demo / "report.md").read_text()
