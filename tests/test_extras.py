"""A missing extra is one line naming the pip install, from the command line and from Python alike.

The extra's packages are hidden from a fresh interpreter (``sys.modules[name] = None``), which is
what Python sees when they are not installed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def _without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys; {hide}{code}"], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("argv", "hidden", "extra"),
    [
        (["trace", "info", "."], ("pandas",), "analysis"),
        (["localize", "."], ("pandas",), "analysis"),
        (["dashboards", "--out", "{tmp}"], ("grafanalib",), "dashboards"),
        (["alerts", "--out", "{tmp}"], ("yaml",), "dashboards"),  # PyYAML comes with both: the command's extra is named
    ],
)
def test_a_command_without_its_extra_says_which_to_install(tmp_path, argv, hidden, extra):
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    result = _without(hidden, f"from trainhealth._internal.cli import main; sys.exit(main({argv!r}))")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert f"needs the '{extra}' extra" in lines[0] and f"pip install 'trainhealth[{extra}]'" in lines[0]
    assert f"trainhealth {argv[0]}" in lines[0]


def test_the_python_api_names_the_extra_too():
    result = _without(("pandas",), "from trainhealth.traces import read_trace")
    assert result.returncode == 1
    assert (
        "trainhealth._internal._extras.MissingExtra: trainhealth.traces.read_trace needs the 'analysis' extra"
        in result.stderr
    )


def test_the_core_records_and_writes_a_trace_without_any_extra(tmp_path):
    heavy = ("pandas", "pyarrow", "statsmodels", "scipy", "grafanalib", "matplotlib", "yaml", "rich")
    result = _without(
        heavy,
        "import trainhealth, trainhealth.comm; from trainhealth import Monitor; "
        "from trainhealth._internal.exporters.collectives.logger import CollectiveLogger; "
        f"logger = CollectiveLogger(rank=0, trace_dir={str(tmp_path)!r}); "
        "logger.end('all_reduce', 'dp0', 0, 1.0, 0.5, 64, None, False); "
        "print(logger.write_trace().name)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "rank-0.0000.jsonl.gz"
    from trainhealth.traces import read_trace  # read back where the analysis extra is installed

    records = read_trace([tmp_path]).records
    assert list(records["op"]) == ["all_reduce"] and list(records["duration"]) == [0.5]


def test_a_monitor_asking_for_stl_without_the_extra_fails_at_once_naming_the_setting():
    result = _without(
        ("statsmodels",),
        "import trainhealth; trainhealth.Settings.resolve(env={}); "
        "from trainhealth._internal.detectors.spec import parse_setting; parse_setting('loss=stl')",
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "trainhealth._internal.config.fields.ConfigError: detectors (TRAINHEALTH_DETECTORS): stl for loss: "
        "stl needs the 'analysis' extra (statsmodels): "
        "pip install 'trainhealth[analysis]'"
    )
