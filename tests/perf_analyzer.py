"""Run NVIDIA's perf_analyzer (Triton's load generator) against a server and read its numbers.

``make perf-analyzer`` installs it into ``.venv-peers/perf_analyzer/`` (``PERF_ANALYZER_HOME``
overrides that), and ``benchmarks/peers/perf_analyzer`` runs it through a private glibc 2.41
loader, since the binary needs glibc 2.38. :func:`command` says whether it is there (a test
skips without it); :func:`run` runs one concurrency level and parses the CSV perf_analyzer
writes with ``-f``. This module holds no tests.
"""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "benchmarks" / "peers" / "perf_analyzer"


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer failed, timed out or wrote no usable CSV; the message holds its output."""

    def __init__(
        self, reason: str, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str
    ) -> None:
        self.reason = reason
        self.argv = tuple(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        status = "" if returncode is None else f" (exit status {returncode})"
        super().__init__(
            f"perf_analyzer {reason}{status}\n"
            f"command: {subprocess.list2cmdline(self.argv)}\n"
            f"--- stdout ---\n{stdout.rstrip()}\n--- stderr ---\n{stderr.rstrip()}"
        )


@dataclass(frozen=True)
class PerfResult:
    """One concurrency level: throughput and latency from the CSV, and the whole run's output."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    throughput: float
    """Inferences per second (the CSV's ``Inferences/Second``)."""
    p50_us: int
    """Median client latency in microseconds (``p50 latency``)."""
    p99_us: int
    """99th percentile client latency in microseconds (``p99 latency``)."""
    row: Mapping[str, str]
    """The CSV row itself (perf_analyzer's column names), for the other columns."""


def _home() -> Path:
    env = os.environ.get("PERF_ANALYZER_HOME")
    return Path(env) if env else REPO / ".venv-peers" / "perf_analyzer"


def command() -> list[str] | None:
    """The argv prefix that runs perf_analyzer, or None when ``make perf-analyzer`` has not run."""
    home = _home()
    loader = home / "sysroot" / "usr" / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2"
    binary = home / "wheel" / "perf_analyzer" / "bin" / "perf_analyzer"
    if not ((home / ".installed").is_file() and loader.is_file() and binary.is_file()):
        return None
    return [str(WRAPPER)]


def run(
    model: str,
    url: str,
    *,
    protocol: str = "http",
    concurrency: int = 1,
    measurement_ms: int = 2000,
    extra: Sequence[str] = (),
    timeout: float = 120,
) -> PerfResult:
    """Measure ``model`` at ``url`` (``host:port``, no scheme) with ``concurrency`` requests in
    flight over ``protocol`` ("http" or "grpc"), in windows of ``measurement_ms``.

    ``extra`` is appended to the command line (e.g. ``["--shared-memory", "system"]``; paths in
    it are relative to this process's working directory). perf_analyzer repeats windows until
    three in a row are within 10% of each other (``-s``, ``-r`` in ``extra`` change that).
    Raises :class:`PerfAnalyzerError`, with the tool's output, when it is not installed, exits
    non-zero, runs past ``timeout`` seconds or writes no CSV row.
    """
    prefix = command()
    if prefix is None:
        raise PerfAnalyzerError(
            f"is not installed in {_home()}: run `make perf-analyzer`", [str(WRAPPER)], None, "", ""
        )
    with tempfile.TemporaryDirectory(prefix="perf_analyzer-") as tmp:
        csv_path = Path(tmp) / "perf.csv"
        argv = [
            *prefix,
            "-m",
            model,
            "-u",
            url,
            "-i",
            protocol,
            "--concurrency-range",
            str(concurrency),
            "--measurement-interval",
            str(measurement_ms),
            "-f",
            str(csv_path),
            *extra,
        ]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise PerfAnalyzerError(
                f"ran past its {timeout:g} s timeout",
                argv,
                None,
                _text(exc.stdout),
                _text(exc.stderr),
            ) from None
        if proc.returncode != 0:
            raise PerfAnalyzerError("failed", argv, proc.returncode, proc.stdout, proc.stderr)
        try:
            with csv_path.open(newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError:
            rows = []
        if not rows:
            raise PerfAnalyzerError(
                f"wrote no CSV row to {csv_path}", argv, proc.returncode, proc.stdout, proc.stderr
            )
    # One row per concurrency level, sorted by throughput: take the one measured here.
    row = next((r for r in rows if r.get("Concurrency") == str(concurrency)), rows[-1])
    try:
        throughput = float(row["Inferences/Second"])
        p50 = int(row["p50 latency"])
        p99 = int(row["p99 latency"])
    except (KeyError, ValueError) as exc:
        raise PerfAnalyzerError(
            f"wrote a CSV row without {exc}: {row}", argv, proc.returncode, proc.stdout, proc.stderr
        ) from None
    return PerfResult(
        argv=tuple(argv),
        returncode=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        throughput=throughput,
        p50_us=p50,
        p99_us=p99,
        row=dict(row),
    )


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
