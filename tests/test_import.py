"""What importing trainhealth costs, and what happens without torch (the names themselves: test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_trainhealth_does_not_import_torch():
    result = _python("import sys, trainhealth, trainhealth._internal.cli; print('torch' in sys.modules)")
    assert result.stdout.strip() == "False", result.stderr


HEAVY = ("pandas", "pyarrow", "statsmodels", "scipy", "grafanalib", "matplotlib", "torch", "opentelemetry.sdk")


@pytest.mark.parametrize("module", ["trainhealth", "trainhealth._internal.cli", "trainhealth.comm"])
def test_the_core_the_monitor_and_the_command_line_load_no_analysis_library(module):
    result = _python(
        f"import sys, {module}; print(sorted({{m for m in sys.modules for h in {HEAVY!r} "
        f"if m == h or m.startswith(h + '.')}}))"
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_lazy_names_still_resolve():
    from trainhealth import localize, traces

    assert localize.localize.__name__ == "localize" and traces.read_trace.__name__ == "read_trace"
    with pytest.raises(AttributeError):
        traces.no_such_name  # noqa: B018


def test_without_torch_the_monitor_says_what_to_install():
    result = _python(
        "import sys; sys.modules['torch'] = None\n"
        "import trainhealth\n"
        "try:\n"
        "    trainhealth.Monitor()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert "trainhealth.Monitor needs PyTorch" in result.stdout
    assert "pip install 'trainhealth[torch]'" in result.stdout
