"""The CPU benchmark harness runs end to end (tiny shapes, one round) and writes its table and
JSON. Speed is never asserted: only that every case measured something and the report is
complete."""
import json
import os
import sys

import pytest

from tests.helpers import ROOT, run_entry

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cpu_benchmark  # noqa: E402

CASES = ["ms_train_step", "ms_train_loop", "ms_infer_mindir", "ort_infer", "torch_train_nchw",
         "torch_infer_nchw", "gemm_ort", "data_pipeline"]


@pytest.mark.slow
def test_harness_measures_every_case_and_writes_the_report(cifar_small, tmp_path):
    result = run_entry("benchmarks/cpu_benchmark.py", "--net_name", "resnet18", "--batch_size",
                       "2", "--image_size", "32", "--class_num", "10", "--rounds", "1",
                       "--steps", "1", "--loop_steps", "1", "--threads", "1", "--gemm_n",
                       "256", "--data_path",
                       cifar_small["train"],
                       "--cases", ",".join(CASES), "--output_dir", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    record = json.load(open(tmp_path / "cpu_benchmark.json"))
    for name in CASES:
        summary = record["results"][name]
        assert "error" not in summary, (name, summary)
        assert summary["rate"] > 0 and summary["peak_rss_mb"] > 0 and summary["rounds"] == 1
    assert record["fp32_limit"]["gemm"] == "gemm_ort"
    assert record["fp32_limit"]["forward_gflop_per_image"] > 0
    table = open(tmp_path / "cpu_benchmark.md").read()
    assert table in result.stdout
    # ours get a ratio against the PyTorch reference of the same kind; the reference rows none
    rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["ours: train step"].count("x |") == 1
    assert rows["ours: ONNX (BN folded) in ONNX Runtime"].count("x |") == 1
    assert "x |" not in rows["PyTorch NCHW"]
    assert "Data pipeline alone:" in table and "fp32 limit" in table
    # a small GEMM (the case, not the machine), reaching the worker
    assert "the fastest GEMM (n=256, " in table
    assert record["runs"]["gemm_ort"][0]["units_per_call"] == 2 * 256 ** 3
    assert "widest ISA" in table.splitlines()[0]  # the ratios to PyTorch depend on it
    # a saved run is reported again, identically, without measuring
    again = run_entry("benchmarks/cpu_benchmark.py", "--from_json",
                      tmp_path / "cpu_benchmark.json", "--output_dir", tmp_path / "again")
    assert again.returncode == 0, again.stderr[-2000:]
    assert open(tmp_path / "again" / "cpu_benchmark.md").read() == table


@pytest.fixture(scope="module")
def train_breakdown():
    """One breakdown run of our train step and the PyTorch reference's (2 measured steps):
    stdout, read by the two tests below."""
    result = run_entry("benchmarks/onednn_breakdown.py", "--net_name", "resnet18",
                       "--batch_size", "2", "--image_size", "32", "--cases",
                       "ms_train_step,torch_train_nchw", "--steps", "2")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def case_table(stdout, case):
    """The per-primitive table the breakdown printed for ``case``: its heading line, a blank
    line, the rows up to the next blank line."""
    start = stdout.index(f"{case}, resnet18, batch 2, 32 px: one step")
    end = stdout.index("\n\n", stdout.index("\n\n", start) + 2)
    return stdout[start:end]


@pytest.mark.slow
def test_onednn_breakdown_reports_convolution_time(train_breakdown):
    table = case_table(train_breakdown, "ms_train_step")
    rows = [line for line in table.splitlines() if line.startswith("| convolution")]
    passes = {row.split(" | ")[2] for row in rows}
    assert passes == {"forward_training", "backward_data", "backward_weights"}, rows
    assert "not oneDNN: the framework's own kernels and runtime" in table


def summary_rows(stdout):
    """{(case, ISA column): cells} of the breakdown's summary table."""
    table = stdout[stdout.index("| case |"):]
    return {tuple(line.split(" | ")[:2]): line.split(" | ")
            for line in table.splitlines()[2:] if line.startswith("| ")}


def cpu_has_avx512():
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return "avx512f" in f.read()


@pytest.mark.slow
def test_onednn_breakdown_compares_ours_with_pytorch_per_part(train_breakdown):
    """The PyTorch reference runs with oneDNN's own ISA choice (not our AVX2 cap), and the
    summary splits each step into convolution passes and the rest."""
    assert "| convolution" in case_table(train_breakdown, "torch_train_nchw")
    rows = summary_rows(train_breakdown)
    ours = rows[("| ms_train_step", "AVX2 (Intel AVX2)")]
    # oneDNN names an AVX-512 CPU's ISA "AVX-512 ..." or, on CPUs with AVX10, "AVX 10.1"
    widest = ("AVX-512", "AVX 10") if cpu_has_avx512() else ("AVX2",)
    torch_row = next(cells for (case, isa), cells in rows.items()
                     if case == "| torch_train_nchw" and isa.startswith("oneDNN's own"))
    assert any(name in torch_row[1] for name in widest), torch_row
    for cells in (ours, torch_row):  # conv forward and weight gradients measured in each
        assert float(cells[4]) > 0 and float(cells[6]) > 0, cells


@pytest.mark.slow
def test_onednn_breakdown_runs_each_isa_level():
    result = run_entry("benchmarks/onednn_breakdown.py", "--net_name", "resnet18",
                       "--batch_size", "2", "--image_size", "32", "--cases", "ms_infer",
                       "--isa_levels", "AVX2,AVX512_CORE")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = summary_rows(result.stdout)
    assert ("| ms_infer", "AVX2 (Intel AVX2)") in rows, rows
    # a level above the CPU's widest ISA resolves to the widest
    in_force = next(isa for case, isa in rows if isa.startswith("AVX512_CORE"))
    assert ("AVX-512" in in_force) == cpu_has_avx512(), in_force


ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx fma avx2 bmi2 sha_ni
"""
ZEN5_FLAGS = "fpu avx2 avx512f avx512dq avx_vnni avx512_bf16 avx512_vnni avx512_vp2intersect"


def test_describe_cpu_names_model_numbers_and_widest_isa():
    assert cpu_benchmark.describe_cpu(ZEN3) == (
        "AMD EPYC 7B13 (family 25, model 1; widest ISA AVX2)")
    zen5 = ZEN3.replace("25", "26").replace("model\t\t: 1", "model\t\t: 2").replace(
        "7B13", "9B45").replace("fpu sse2 avx fma avx2 bmi2 sha_ni", ZEN5_FLAGS)
    assert cpu_benchmark.describe_cpu(zen5) == (
        "AMD EPYC 9B45 (family 26, model 2; widest ISA AVX-512 with VNNI and BF16)")
    amx = zen5.replace("avx512_vp2intersect", "amx_tile amx_bf16")
    assert cpu_benchmark.describe_cpu(amx).endswith("widest ISA AMX)")
    assert cpu_benchmark.describe_cpu(ZEN3.replace("avx2 ", "")).endswith("widest ISA below AVX2)")
    no_ids = "model name\t: Some CPU\nflags\t\t: avx2 avx512f\n"
    assert cpu_benchmark.describe_cpu(no_ids) == "Some CPU (widest ISA AVX-512)"


def test_update_docs_replaces_only_the_marked_block(tmp_path):
    page = tmp_path / "speed.md"
    page.write_text(f"intro\n{cpu_benchmark.TABLE_START}\nold\n{cpu_benchmark.TABLE_END}\nend\n")
    cpu_benchmark.update_docs("| new |\n", str(page))
    assert page.read_text() == (f"intro\n{cpu_benchmark.TABLE_START}\n| new |\n"
                                f"{cpu_benchmark.TABLE_END}\nend\n")
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="speed.md has no"):
        cpu_benchmark.update_docs("x", str(page))


def test_update_docs_targets_the_speed_page_which_holds_the_markers():
    assert cpu_benchmark.SPEED_PAGE == os.path.join(cpu_benchmark.ROOT, "docs", "speed.md")
    text = open(cpu_benchmark.SPEED_PAGE, encoding="utf-8").read()
    assert text.count(cpu_benchmark.TABLE_START) == 1 and text.count(cpu_benchmark.TABLE_END) == 1


def test_every_inference_case_of_ours_names_the_file_it_loads():
    """``prepare`` writes only the files of the chosen cases: each inference case that loads
    one must name it, or it would find none."""
    ours = {name for name, case in cpu_benchmark.CASES.items()
            if case[0] == "infer" and not name.startswith("torch_")}
    assert set(cpu_benchmark.LOADED_FILES) == ours


def test_unknown_case_is_an_error_listing_valid_ones():
    result = run_entry("benchmarks/cpu_benchmark.py", "--cases", "ms_train_step,fast_mode")
    assert result.returncode == 2
    assert "unknown case(s) fast_mode" in result.stderr and "ort_infer" in result.stderr
