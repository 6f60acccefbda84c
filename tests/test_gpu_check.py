"""The GPU check's parts that run without a GPU: the probe at a tiny size, the report."""

import json
import os
import subprocess
import sys

import pytest

from tests._scripts import BENCHMARKS, load_benchmark


def test_imagenet_probe_runs_at_a_tiny_size_on_cpu(tmp_path):
    probe = load_benchmark("bench_probe_imagenet")
    out = tmp_path / "probe.json"
    args = "--n-samples 600 --n-features 16 --n-classes 5 --lbfgs-iter 30 --adam-epochs 3"
    probe.main([*args.split(), "--device", "cpu", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["features_dtype"] == "float16"
    assert result["features_bytes"] == 600 * 16 * 2
    assert set(result["fits"]) == {"lbfgs", "adam"}
    for solver, fit in result["fits"].items():
        assert fit["solver"] == solver and fit["fit_s"] > 0
        assert "peak_gpu_bytes" not in fit  # measured on CUDA only
    assert 1 <= result["fits"]["lbfgs"]["n_iter"] <= 30
    assert result["fits"]["adam"]["n_iter"] == 3
    assert result["fits"]["lbfgs"]["train_accuracy"] > 0.6  # chance: 0.2


@pytest.mark.slow
def test_gpu_check_without_cuda_says_so_and_exits_0(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path / "check.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA device found" in done.stdout
    result = json.loads((tmp_path / "check.json").read_text())
    assert result == {
        "ran": False,
        "ok": False,
        "reason": "no CUDA device found (torch.cuda.is_available() is False)",
    }


def test_gpu_check_with_an_interpreter_that_does_not_run_fails(tmp_path):
    # It said "no CUDA device found" and exited 0, as if the machine had no GPU.
    broken = tmp_path / 'py "th\\on\t3'  # written into JSON as it is
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), str(tmp_path / "check.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": str(broken)},
        timeout=60,
    )
    assert done.returncode == 1
    reason = json.loads((tmp_path / "check.json").read_text())["reason"]
    assert reason == f"{broken} does not run".replace("\t", " ")


def test_report_collects_every_section(tmp_path):
    report = load_benchmark("gpu_check_report")
    (tmp_path / "fit.json").write_text('{"rows": [{"fit_s": 1.5}]}')
    (tmp_path / "fit.log").write_text("the table\n")
    (tmp_path / "broken.log").write_text("Traceback ...\n")
    lines = [
        ["pytest_cuda", "ran", "0", "12", "60", "", "", "python -m pytest -m cuda"],
        ["bench_fit", "ran", "0", "30", "60", str(tmp_path / "fit.json"), str(tmp_path / "fit.log"),
         "python benchmarks/bench_fit.py"],
        ["bench_cv", "skipped", "", "", "", "", "", "benchmarks/bench_cv.py does not exist"],
        ["probe", "ran", "124", "150", "150", str(tmp_path / "none.json"),
         str(tmp_path / "broken.log"), "python probe.py"],
    ]  # fmt: skip
    (tmp_path / "sections.tsv").write_text("".join("\t".join(x) + "\n" for x in lines))
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_classifier" name="a" time="0.5"/>'
        '<testcase classname="tests.test_classifier" name="b" time="0">'
        '<skipped message="needs CUDA"/></testcase></testsuite></testsuites>'
    )
    result = report.build_report(tmp_path / "sections.tsv", tmp_path / "junit.xml", 200)
    sections = result["sections"]
    assert list(sections) == ["pytest_cuda", "bench_fit", "bench_cv", "probe"]
    assert sections["bench_fit"]["status"] == "ok"
    assert sections["bench_fit"]["result"] == {"rows": [{"fit_s": 1.5}]}
    assert sections["bench_fit"]["output"] == "the table\n"
    assert sections["bench_cv"] == {
        "status": "skipped",
        "limit_s": None,
        "reason": "benchmarks/bench_cv.py does not exist",
        "result": None,
    }
    assert sections["probe"]["status"] == "timed out" and sections["probe"]["result"] is None
    assert not result["ok"]
    assert result["pytest_cuda"]["passed"]
    assert result["pytest_cuda"]["counts"] == {"passed": 1, "skipped": 1}
    assert result["pytest_cuda"]["tests"][1]["message"] == "needs CUDA"
    assert result["environment"]["packages"]["torch"]


def test_a_check_in_which_no_cuda_test_passed_is_no_success(tmp_path, monkeypatch):
    # Every section ran, but every CUDA test was skipped: the report said "all passed".
    report = load_benchmark("gpu_check_report")
    line = ["pytest_cuda", "ran", "0", "3", "60", "", "", "python -m pytest -m cuda"]
    (tmp_path / "sections.tsv").write_text("\t".join(line) + "\n")
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="t" name="a" time="0">'
        '<skipped message="needs CUDA"/></testcase></testsuite></testsuites>'
    )
    monkeypatch.setenv("GPU_CHECK_COMMIT", "0123abc")  # the device's copy has no .git
    result = report.build_report(tmp_path / "sections.tsv", tmp_path / "junit.xml", 3)
    assert result["sections"]["pytest_cuda"]["status"] == "ok"
    assert not result["pytest_cuda"]["passed"] and not result["ok"]
    assert result["environment"]["commit"] == "0123abc"
