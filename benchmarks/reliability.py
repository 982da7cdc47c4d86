"""Reliability figures (issue 17): what survives a job that ends badly, and what the Monitor never does.

    python benchmarks/reliability.py                # every part
    python benchmarks/reliability.py --only traces  # one part: traces, close, loop, auth, corpus

* **traces** — a real 4-rank gloo job (each rank ``trainhealth.comm`` with a trace
  directory, all-reduces with 1 ms of "compute" between them) ended three ways: a
  normal exit without ``uninstall()`` or ``close()``; SIGTERM to every rank at once, as
  torchrun, Kubernetes and Slurm send it; SIGKILL to every rank. Ground truth is each
  rank's own count of completed operations, appended with its time to a side file
  every 25 operations. Printed: the share of operations in the trace, of all of them
  (normal exit), of those completed more than 2 s before SIGTERM, and of those
  completed more than one flush interval (1 s) before SIGKILL.
* **close** — ``Monitor.close()`` time with the OTLP endpoint unreachable (a closed
  port on 127.0.0.1) and silent (a socket that accepts and never answers).
* **loop** — 20,000 steps of a Monitor beside faults (a parameter whose gradient is
  missing, a NaN loss every 100 steps, the OTLP endpoint unreachable, simulated GPUs; a /metrics
  port already taken is a configuration error, refused at once): exceptions that reached the loop, steps completed,
  memory growth as tracemalloc sees it after a full garbage collection (without it, the reading
  includes cyclic garbage the collector has not reached yet: the OTLP exporter's failed requests
  leave exception/traceback cycles that only a generation-2 collection frees).
* **auth** — all three endpoints with mTLS and basic auth (a Monitor's /metrics, ``trainhealth export``
  and ``trainhealth analyze`` as real processes), each scraped five ways: only the client with the
  certificate and the password gets a 200.
* **corpus** — the generated bad-input corpus of every command (tests/cli/test_bad_input_*.py: each case
  a real ``trainhealth`` subprocess that must exit 2 with one line, no traceback, no hang, inputs
  unchanged) and the analyzer's bad-upstream corpus (tests/localize/test_analyzer_upstream.py: a real
  Prometheus behind a server answering badly in 16 ways, then refusing connections); printed: the
  invocations per command (counted through ``TRAINHEALTH_BADINPUT_LOG``) and pytest's summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.distributed when run from anywhere

FLUSH_S = 1.0
RANKS = 4


# --- traces ------------------------------------------------------------------------------------------
def _rank(rank: int, world: int, port: int, out: str, operations: int) -> None:
    import torch
    import torch.distributed as dist

    import trainhealth
    import trainhealth.comm
    from tests.distributed import init_rank

    init_rank(rank, world, port, timeout_s=120)
    trainhealth.comm.install(
        trace_dir=out,
        settings=trainhealth.Settings.resolve(env={}, comm_flush_interval=FLUSH_S, trace_write_interval=FLUSH_S),
    )
    progress = os.open(Path(out, f"progress-{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    tensor = torch.ones(256)
    logger = trainhealth.comm.installed()
    for done in range(1, operations + 1):
        logger.step = done // 10
        time.sleep(0.001)
        dist.all_reduce(tensor)
        if done % 25 == 0:
            os.write(progress, f"{done} {time.time():.6f}\n".encode())
    # a normal end of the script: no uninstall(), no close(), no destroy_process_group()


def _completed_before(progress: Path, moment: float) -> int:
    """Operations the rank had completed by ``moment`` (wall clock), from its own side file."""
    done = 0
    for line in progress.read_text().splitlines():
        count, at = line.split()
        if float(at) <= moment:
            done = int(count)
    return done


def trace_recovery(ending: str, operations: int) -> tuple[int, int, int, int]:
    """(operations in the trace, operations that should be; the same over every operation completed) for one
    job ended by ``ending``."""
    from tests.distributed import start_ranks
    from trainhealth.traces import read_trace

    with tempfile.TemporaryDirectory() as out:
        context = start_ranks(_rank, RANKS, out, operations if ending == "exit" else 10**9)
        if ending == "exit":
            deadline = time.monotonic() + 600
            while not context.join(timeout=1) and time.monotonic() < deadline:
                pass
            expected = everything = {rank: operations for rank in range(RANKS)}
        else:
            progress = [Path(out, f"progress-{rank}.txt") for rank in range(RANKS)]
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # until the job has done 5,000 operations (and a few seconds)
                time.sleep(0.5)
                if (
                    all(p.exists() for p in progress)
                    and min(_completed_before(p, time.time()) for p in progress) >= 2000
                ):
                    break
            moment = time.time()
            for process in context.processes:
                os.kill(process.pid, signal.SIGTERM if ending == "sigterm" else signal.SIGKILL)
            for process in context.processes:
                process.join(timeout=60)
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
                    process.join(timeout=10)
            margin = 2.0 if ending == "sigterm" else FLUSH_S
            expected = {rank: _completed_before(progress[rank], moment - margin) for rank in range(RANKS)}
            everything = {rank: _completed_before(progress[rank], moment) for rank in range(RANKS)}
        records = read_trace([out]).records

        def found(counts: dict[int, int]) -> int:
            total = 0
            for rank, count in counts.items():
                seqs = records[(records["rank"] == rank) & (records["op"] == "all_reduce")]["seq"]
                total += int((seqs < count).sum())
            return total

        return found(expected), sum(expected.values()), found(everything), sum(everything.values())


def report_traces(operations: int) -> None:
    for ending, meaning in (
        ("exit", "all operations, normal exit without close()"),
        ("sigterm", "operations older than 2 s at SIGTERM"),
        ("sigkill", f"operations older than the flush interval ({FLUSH_S:g} s) at SIGKILL"),
    ):
        found, expected, found_all, completed = trace_recovery(ending, operations)
        print(
            f"trace, {RANKS}-rank gloo job, {meaning}: {found:,} of {expected:,} in the trace "
            f"({100 * found / max(expected, 1):.2f}%); of every operation completed: {found_all:,} of "
            f"{completed:,} ({100 * found_all / max(completed, 1):.2f}%)",
            flush=True,
        )


# --- close -------------------------------------------------------------------------------------------
def close_time(endpoint: str) -> float:
    import trainhealth

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint  # the OpenTelemetry SDK reads the process environment
    monitor = trainhealth.Monitor(None, None, env={}, otel=True, prometheus=False, gpu_backend="off")
    monitor.step(loss=1.0)
    began = time.perf_counter()
    monitor.close()
    return time.perf_counter() - began


def report_close() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        unreachable = close_time(f"http://127.0.0.1:{port}")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts (the kernel does) and never answers
        answerless = close_time(f"http://127.0.0.1:{silent.getsockname()[1]}")
    print(
        f"Monitor.close() with the OTLP endpoint refusing connections: {unreachable:.2f} s; "
        f"accepting and never answering: {answerless:.2f} s (target <= 2 s)",
        flush=True,
    )


# --- the training loop -------------------------------------------------------------------------------
def report_loop(steps: int) -> None:
    import torch

    import trainhealth

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    frozen = torch.nn.Linear(4, 4)  # in the optimizer, never in the graph: its gradient is missing
    optimizer = torch.optim.SGD([*model.parameters(), *frozen.parameters()], lr=0.01)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monitor = trainhealth.Monitor(
            model,
            optimizer,
            env={},
            otel=True,
            prometheus=True,
            prometheus_addr="127.0.0.1",
            prometheus_port=0,
            gpu_backend="simulated",
        )
        escaped, recorded = 0, 0
        tracemalloc.start()
        baseline = middle = 0
        x = torch.randn(8, 16)
        for step in range(steps):
            try:
                loss = model(x).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                monitor.step(loss=float("nan") if step % 100 == 99 else loss)
                recorded += 1
            except Exception:
                escaped += 1
            if step == 1000:
                baseline = _live_bytes()
            if step == steps // 2:
                middle = _live_bytes()
        end = _live_bytes()
        growth, second_half = (end - baseline) / 1e6, (end - middle) / 1e6
        tracemalloc.stop()
        monitor.close()
    print(
        f"training loop, {steps:,} steps with a missing gradient, a NaN loss every 100 steps "
        f"and OTLP unreachable: {escaped} exceptions reached the loop, {recorded:,} steps completed, "
        f"live memory (traced, after a full collection) {growth:+.2f} MB from step 1,000 to the end, "
        f"{second_half:+.2f} MB over the second half",
        flush=True,
    )


def _live_bytes() -> int:
    """Bytes tracemalloc sees held once unreachable cycles are collected."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


# --- TLS and authentication ------------------------------------------------------------------------
def _scrape_cases(url: str, ca: Path, client_pem: Path, password: str) -> dict[str, str]:
    """The five clients tried against one endpoint, each with the answer it got."""
    import base64
    import ssl
    import urllib.error
    import urllib.request

    def scrape(client: bool, user: str | None, secret: str | None, scheme: str = "https") -> str:
        context = ssl.create_default_context(cafile=str(ca))
        if client:
            context.load_cert_chain(str(client_pem))
        request = urllib.request.Request(url.replace("https://", f"{scheme}://"))
        if user is not None:
            token = base64.b64encode(f"{user}:{secret}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, context=context if scheme == "https" else None, timeout=5) as answer:
                return str(answer.status)
        except urllib.error.HTTPError as exc:
            return str(exc.code)
        except (urllib.error.URLError, ssl.SSLError, ConnectionError, OSError) as exc:
            return f"refused ({type(getattr(exc, 'reason', exc)).__name__})"

    return {
        "plain HTTP": scrape(True, "prometheus", password, scheme="http"),
        "no client certificate": scrape(False, "prometheus", password),
        "client certificate, no password": scrape(True, None, None),
        "client certificate, wrong password": scrape(True, "prometheus", "guess"),
        "client certificate, right password": scrape(True, "prometheus", password),
    }


def _served_url(process: subprocess.Popen[str]) -> str:
    """The URL a ``trainhealth export``/``analyze`` process prints on its first line."""
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"(https?://\S+/metrics)", line)
    if found is None:
        process.kill()
        raise SystemExit(f"no URL in the first line of {process.args!r}: {line!r}")
    return found.group(1)


def report_auth() -> None:
    """mTLS and basic auth on all three endpoints: a Monitor's /metrics, `trainhealth export`, `trainhealth analyze`."""
    import trustme

    import trainhealth

    authority = trustme.CA()
    server_cert = authority.issue_cert("127.0.0.1")
    client_cert = authority.issue_cert("scraper")
    secret = "s3cret-for-this-run"
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: Path(directory, f"{name}.pem") for name in ("ca", "cert", "key", "client")}
        authority.cert_pem.write_to_path(str(paths["ca"]))
        server_cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
        server_cert.private_key_pem.write_to_path(str(paths["key"]))
        client_cert.private_key_and_cert_chain_pem.write_to_path(str(paths["client"]))
        password = Path(directory, "password")
        password.write_text(secret)
        security = {
            "tls_certfile": str(paths["cert"]),
            "tls_keyfile": str(paths["key"]),
            "tls_client_cafile": str(paths["ca"]),
            "basic_auth_username": "prometheus",
            "basic_auth_password_file": str(password),
        }
        flags = [word for name, value in security.items() for word in (f"--{name.replace('_', '-')}", value)]
        results: dict[str, dict[str, str]] = {}

        monitor = trainhealth.Monitor(
            None,
            None,
            env={},
            otel=False,
            gpu_backend="off",
            prometheus_addr="127.0.0.1",
            prometheus_port=0,
            **security,
        )  # type: ignore[arg-type]
        url = str(monitor.metrics_url).replace("http://", "https://")
        results["Monitor /metrics"] = _scrape_cases(url, paths["ca"], paths["client"], secret)
        monitor.close()

        traces = Path(directory, "traces")
        traces.mkdir()
        commands = {
            "trainhealth export": ["export", "--backend", "simulated", "--simulated-gpus", "2"],
            "trainhealth analyze": ["analyze", "--traces", str(traces), "--interval", "1"],
        }
        for name, argv in commands.items():
            process = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("trainhealth")),
                    *argv,
                    "--addr",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--duration",
                    "60",
                    *flags,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            try:
                results[name] = _scrape_cases(_served_url(process), paths["ca"], paths["client"], secret)
            finally:
                process.terminate()
                process.wait(timeout=30)
    for name, cases in results.items():
        print(f"{name} with mTLS and basic auth: " + "; ".join(f"{k}: {v}" for k, v in cases.items()), flush=True)


# --- the bad-input corpora ----------------------------------------------------------------------------
CORPORA = (
    "tests/cli/test_bad_input_analysis.py",
    "tests/cli/test_bad_input_operations.py",
    "tests/localize/test_analyzer_upstream.py",
)


def report_corpus() -> None:

    root = Path(__file__).resolve().parent.parent
    began = time.monotonic()
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as cases:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *CORPORA],
            cwd=root,
            capture_output=True,
            text=True,
            env={**os.environ, "TRAINHEALTH_BADINPUT_LOG": cases.name},
        )
        invocations = [json.loads(line) for line in cases.read().splitlines() if line.strip()]
    commands: dict[str, int] = {}
    for argv in invocations:
        words = [word for word in argv if not str(word).startswith("-")][:2]
        name = (
            " ".join(str(word) for word in words[:2])
            if words[:1] in (["trace"], ["stack"], ["trainhealth-lab"])
            else (str(words[0]) if words else "(no command)")
        )
        commands[name] = commands.get(name, 0) + 1
    lines = done.stdout.strip().splitlines()
    failed = [line for line in lines if line.startswith("FAILED")]
    summary = lines[-1] if lines else done.stderr.strip()[-300:]
    print(
        f"bad-input corpora: {len(invocations):,} invocations of the real command, each its own process, over "
        f"{len(commands)} commands ({', '.join(f'{k} {v}' for k, v in sorted(commands.items()))}); "
        f"pytest: {summary} ({time.monotonic() - began:.0f} s)",
        flush=True,
    )
    for line in failed:
        print("  " + line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("traces", "close", "loop", "auth", "corpus"), help="run one part")
    parser.add_argument(
        "--operations", type=int, default=1500, help="all-reduces per rank for the normal-exit job (x 4 ranks)"
    )
    parser.add_argument("--steps", type=int, default=20_000, help="steps of the training-loop part")
    args = parser.parse_args()
    if args.only in (None, "traces"):
        report_traces(args.operations)
    if args.only in (None, "close"):
        report_close()
    if args.only in (None, "loop"):
        report_loop(args.steps)
    if args.only in (None, "auth"):
        report_auth()
    if args.only in (None, "corpus"):
        report_corpus()


if __name__ == "__main__":
    main()
