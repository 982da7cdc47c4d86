"""Every ```python block of the README and docs/integrations.md runs as written and exports the loss.

Each block is executed in a fresh interpreter with a timeout, in an empty directory, with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/HTTP receiver on 127.0.0.1 (the
Monitor then pushes its metrics; its close, explicit or at exit, pushes the last ones),
/metrics on a free port of 127.0.0.1 and the GPU sampler off. A block passes when the
process exits 0 and a ``trainhealth.train.loss`` data point arrived. More markdown files
can be checked with ``TRAINHEALTH_TEST_DOCS=a.md:b.md`` (os.pathsep-separated).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.distributed import free_port
from tests.otlp import OtlpReceiver
from tests.tiers import sweep

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "integrations.md"]
DOCUMENTS += [Path(p) for p in os.environ.get("TRAINHEALTH_TEST_DOCS", "").split(os.pathsep) if p]
TIMEOUT_S = 120
LOSS = "trainhealth.train.loss"

_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE
)


def python_blocks(markdown: Path) -> list[tuple[int, str]]:
    """The ```python blocks of ``markdown``: (line of the opening fence, code), in order."""
    text = markdown.read_text(encoding="utf-8")
    blocks = []
    for match in _BLOCK.finditer(text):
        indent = len(match.group("indent"))
        code = "".join(line[indent:] for line in match.group("code").splitlines(keepends=True))
        blocks.append((text.count("\n", 0, match.start()) + 1, code))
    return blocks


def snippet_env(endpoint: str) -> dict[str, str]:
    """The environment a snippet runs in: this one, less distributed and trainhealth/OTel settings, plus ours."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("TRAINHEALTH_", "OTEL_"))
        and key not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    }
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        TRAINHEALTH_PROMETHEUS_ADDR="127.0.0.1",
        TRAINHEALTH_PROMETHEUS_PORT="0",
        TRAINHEALTH_GPU_BACKEND="off",
        PYTHONUNBUFFERED="1",
        MASTER_PORT=str(free_port()),
    )  # a snippet that starts a one-rank group takes a free port
    return env


def run_snippet(code: str, workdir: Path, timeout_s: float = TIMEOUT_S) -> tuple[subprocess.CompletedProcess, list]:
    """Run ``code`` as a script in ``workdir``; the process and the loss data points it pushed over OTLP."""
    script = workdir / "snippet.py"
    script.write_text(code, encoding="utf-8")
    receiver = OtlpReceiver()
    try:
        process = subprocess.run(
            [sys.executable, str(script)],
            check=False,
            cwd=workdir,
            env=snippet_env(receiver.endpoint),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        try:
            points = receiver.last_points(LOSS)
        except AssertionError:
            points = []
    finally:
        receiver.close()
    return process, points


def check_snippet(code: str, workdir: Path, where: str) -> None:
    process, points = run_snippet(code, workdir)
    output = (process.stdout + process.stderr)[-4000:]
    returncode = process.returncode
    assert returncode == 0, f"{where} exited {returncode}:\n{output}"
    assert points, f"{where} exported no {LOSS} over OTLP:\n{output}"
    assert all(math.isfinite(point.as_double) for point in points), f"{where}: {points}"


def _cases() -> list:
    cases = []
    for document in DOCUMENTS:
        name = document.relative_to(ROOT).as_posix() if document.is_relative_to(ROOT) else document.name
        for line, code in python_blocks(document):
            cases.append((code, f"{name}:{line}"))
    return cases


@sweep(("code", "where"), _cases(), ids=[where for _, where in _cases()])
def test_snippet_runs_and_exports_the_loss(code, where, tmp_path):
    check_snippet(code, tmp_path, where)


def test_blocks_are_found(tmp_path):
    markdown = tmp_path / "doc.md"
    markdown.write_text(
        "text\n\n```python\nprint(1)\n```\n\n```bash\nls\n```\n\n- item\n\n  ```python\n  x = 2\n  print(x)\n  ```\n",
        encoding="utf-8",
    )
    assert python_blocks(markdown) == [(3, "print(1)\n"), (13, "x = 2\nprint(x)\n")]
