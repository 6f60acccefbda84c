"""Collect the sections of ``benchmarks/gpu_check.sh`` into one JSON file.

``gpu_check.sh`` writes one tab-separated line per section (name, status, return code,
seconds, time limit, JSON path, log path, command or reason); this script reads them with
each section's JSON output (or, where there is none, the end of its output), the CUDA
tests' JUnit XML, and the versions of the software and the GPU, and writes::

    {"environment": {...}, "ok": bool, "pytest_cuda": {...}, "sections": {name: {...}}}

    python benchmarks/gpu_check_report.py SECTIONS.tsv JUNIT.xml OUT.json TOTAL_SECONDS
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUTPUT_TAIL = 20_000  # characters of a section's output kept in the JSON
PACKAGES = ("numpy", "scikit-learn", "torch", "torchvision", "timm", "h5py", "open_clip_torch")


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(command):
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment():
    """Python, package and CUDA versions, the GPU, and the commit if there is a git tree."""
    import torch

    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        # A copy of the tree without its .git (the device machine's) names it by hand.
        "commit": os.environ.get("GPU_CHECK_COMMIT") or _run(["git", "rev-parse", "HEAD"]),
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {
            "name": props.name,
            "count": torch.cuda.device_count(),
            "memory_bytes": props.total_memory,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        }
    return env


def junit_tests(path):
    """Each test case of a pytest JUnit XML file: name, outcome, seconds, message."""
    path = Path(path)
    if not path.is_file():
        return None
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = found.get("message")
                break
        tests.append(
            {
                "name": f"{case.get('classname')}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0.0)),
                "message": message,
            }
        )
    return tests


def read_sections(path):
    """The sections in the order they ran, from ``gpu_check.sh``'s tab-separated lines."""
    sections = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        name, status, rc, seconds, limit, json_path, log_path, note = line.split("\t", 7)
        section = {"status": status, "limit_s": float(limit) if limit else None}
        if status == "skipped":
            section["reason"] = note
        else:
            rc = int(rc)
            section.update(
                status="ok" if rc == 0 else ("timed out" if rc in (124, 137) else "failed"),
                returncode=rc,
                seconds=float(seconds),
                command=note,
            )
        result = None
        if json_path and Path(json_path).is_file():
            try:
                result = json.loads(Path(json_path).read_text())
            except json.JSONDecodeError as exc:
                section["json_error"] = str(exc)
        section["result"] = result
        if log_path and Path(log_path).is_file():
            section["output"] = Path(log_path).read_text(errors="replace")[-OUTPUT_TAIL:]
        sections[name] = section
    return sections


def build_report(sections_tsv, junit_xml, total_s):
    """The whole report as a dict (see the module docstring)."""
    sections = read_sections(sections_tsv)
    tests = junit_tests(junit_xml)
    pytest_section = sections.get("pytest_cuda", {})
    outcomes = [t["outcome"] for t in tests or []]
    pytest_cuda = {
        "passed": pytest_section.get("status") == "ok" and "passed" in outcomes,
        "counts": {k: outcomes.count(k) for k in sorted(set(outcomes))},
        "tests": tests,
    }
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "total_s": total_s,
        # No CUDA test that passed (all skipped, or none collected) is no check of CUDA.
        "ok": pytest_cuda["passed"]
        and all(s["status"] in ("ok", "skipped") for s in sections.values()),
        "pytest_cuda": pytest_cuda,
        "sections": sections,
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4:
        sys.exit(f"usage: {__doc__.strip().splitlines()[-1].strip()}")
    sections_tsv, junit_xml, out, total_s = argv
    report = build_report(sections_tsv, junit_xml, float(total_s))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    states = ", ".join(f"{name}: {s['status']}" for name, s in report["sections"].items())
    print(f"gpu_check: {'all passed' if report['ok'] else 'FAILURES'} ({states}); wrote {out}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
