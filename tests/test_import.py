"""The public surface, and what happens without torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "trainhealth": ["ConfigError", "Identity", "LayerGroupStats", "Monitor", "Settings", "StepStats", "__version__"],
    "trainhealth.exporters": [
        "BasicAuth",
        "LayerGroupStats",
        "MetricsServer",
        "Monitor",
        "OtelExporter",
        "Sinks",
        "StepStats",
        "StoreCollector",
        "TLSFiles",
    ],
    "trainhealth.catalog": ["CATALOG", "IDENTITY_LABELS", "MetricKind", "MetricSpec", "Unit", "by_prometheus_name"],
    "trainhealth.config": [
        "CommSettings",
        "ConfigError",
        "DetectorSettings",
        "GpuSettings",
        "IdentitySettings",
        "ModelSettings",
        "OtelSettings",
        "PrometheusSettings",
        "SettingInfo",
        "Settings",
        "StoreSettings",
        "TrainingSettings",
        "setting_infos",
    ],
    "trainhealth.store": ["Family", "HistogramValue", "MetricStore"],
    # the paths users write (README, docs/integrations.md): pinned, whatever moves inside the package
    "trainhealth.comm": ["CollectiveLogger", "install", "installed", "instrument_ddp", "uninstall"],
    "trainhealth.integrations.huggingface": ["TrainhealthCallback"],
    "trainhealth.integrations.lightning": ["TrainhealthCallback"],
    "trainhealth.integrations.accelerate": ["TrainhealthTracker"],
    "trainhealth.integrations.torchtitan": ["TORCHTITAN_KEYS", "TrainhealthLogger"],
    "trainhealth.cli": ["build_parser", "main"],
    "trainhealth.traces": [
        "Topology",
        "Trace",
        "TraceError",
        "read_trace",
        "read_trace_file",
        "validate",
        "write_trace",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names(module):
    if module.startswith("trainhealth.integrations."):
        pytest.importorskip(
            {
                "huggingface": "transformers",
                "lightning": "lightning",
                "accelerate": "accelerate",
                "torchtitan": "torch",
            }[module.rsplit(".", 1)[1]]
        )
    imported = importlib.import_module(module)
    for name in PUBLIC[module]:
        assert name in imported.__all__
        assert getattr(imported, name) is not None
    for name in imported.__all__:
        assert hasattr(imported, name), name


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_importing_trainhealth_does_not_import_torch():
    result = _python("import sys, trainhealth, trainhealth.cli; print('torch' in sys.modules)")
    assert result.stdout.strip() == "False", result.stderr


HEAVY = ("pandas", "pyarrow", "statsmodels", "scipy", "grafanalib", "matplotlib", "torch", "opentelemetry.sdk")


@pytest.mark.parametrize("module", ["trainhealth", "trainhealth.cli", "trainhealth.comm"])
def test_the_core_the_monitor_and_the_command_line_load_no_analysis_library(module):
    result = _python(
        f"import sys, {module}; print(sorted({{m for m in sys.modules for h in {HEAVY!r} "
        f"if m == h or m.startswith(h + '.')}}))"
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_lazy_names_still_resolve():
    from trainhealth import exporters, traces

    assert exporters.Monitor.__name__ == "Monitor" and traces.read_trace.__name__ == "read_trace"
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
