"""Import a script of benchmarks/ as a module, for tests of its parts."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, as_name: str | None = None):
    """benchmarks/<name>.py as a module named ``as_name`` (default ``name``).

    The script may put benchmarks/ and the project on sys.path to import its siblings
    (bench_fit, bench_cosine): sys.path is restored afterwards, and the siblings it
    imported are dropped from sys.modules, so that no other test sees them.
    """
    path, modules = list(sys.path), set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location(as_name or name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
        for added in set(sys.modules) - modules:
            origin = getattr(sys.modules[added], "__file__", None) or ""
            if Path(origin).parent == BENCHMARKS:
                del sys.modules[added]
    return module
