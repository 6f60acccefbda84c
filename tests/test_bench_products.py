"""benchmarks/bench_products.py times both products at each size and checks them against
float64."""

from tests._scripts import load_benchmark


def test_each_size_gets_both_products_timed_and_within_float32_rounding(capsys):
    # 600 × 512 by 10: the library's own products (oneDNN's logits, the split gradient on
    # more than one thread); 50 × 8 by 2: torch's.
    rows = load_benchmark("bench_products").main(
        ["--sizes", "600x512x10", "50x8x2", "--repeats", "1"]
    )
    assert [row["size"] for row in rows] == ["600x512x10", "50x8x2"]
    for row in rows:
        assert all(t > 0 for t in row["logits_ms"] + row["gradient_ms"])
        assert max(row["logits_errors"] + row["gradient_errors"]) < 1e-5
    assert "600x512x10" in capsys.readouterr().out
