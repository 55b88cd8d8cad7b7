"""The selection benchmark's rows (gtopk_lab.bench.selection) and its CPU line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtopk_lab.bench.selection import bench_selection, cpu_model
from gtopk_lab.bench.tables import print_selection
from gtopk_lab.compression.selection import available_selectors


@pytest.mark.timeout(120)
def test_rows_carry_the_pass_count_beside_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench_selection(20_000, 0.01, repeats=2)
    assert [r["selector"] for r in rows] == list(available_selectors())
    for r in rows:
        assert r["k"] == 200 and r["median_s"] > 0 and r["one_pass_s"] > 0
        assert r["passes"] == pytest.approx(r["median_s"] / r["one_pass_s"])
        assert r["speedup_vs_topk"] == pytest.approx(rows[0]["median_s"] / r["median_s"])
    print_selection(rows, "Some CPU, AVX-512")
    out = capsys.readouterr().out
    assert out.startswith("# CPU: Some CPU, AVX-512\n") and "passes" in out.splitlines()[2]
    assert f"{rows[-1]['passes']:.2f}" in out.splitlines()[-1]


def test_cpu_model_names_the_cpu_and_avx512(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n")
    assert cpu_model(info) == "AMD EPYC 7B13, no AVX-512"
    info.write_text("model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx2 avx512f avx512bw\n")
    assert cpu_model(info) == "Intel(R) Xeon(R) Processor, AVX-512"
    assert cpu_model(tmp_path / "missing")  # not Linux: platform's name, never empty


def test_cpu_model_tells_apart_two_cpus_that_share_a_generic_name(tmp_path: Path) -> None:
    """A VM's "AMD EPYC" was a Zen 3 one day and a Zen 5 the next: the family and model
    numbers name them where the name holds no model number (only the first processor read)."""
    info = tmp_path / "cpuinfo"
    block = "processor\t: {}\ncpu family\t: {}\nmodel\t\t: {}\nmodel name\t: AMD EPYC\nflags\t\t: avx2 avx512f\n"
    info.write_text(block.format(0, 26, 2) + "\n" + block.format(1, 99, 99))
    assert cpu_model(info) == "AMD EPYC (family 26 model 2), AVX-512"
    info.write_text(block.format(0, 25, 17).replace("AMD EPYC", "AMD EPYC 7B13"))
    assert cpu_model(info) == "AMD EPYC 7B13, AVX-512"
