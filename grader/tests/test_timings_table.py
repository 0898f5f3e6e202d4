"""The chapter's table of reference timings: one block per card, each naming its run."""

from __future__ import annotations

from pathlib import Path

from grader.records import TaskResult, Timing, Verdict
from grader.report import timings

ENV = {"gpus": [{"name": "NVIDIA H200", "driver": "580.1"}], "nvcc": "13.0.88", "torch": "2.11.0"}


def result(number: str, verdict: Verdict = Verdict.PASS) -> TaskResult:
    t = Timing(
        "saxpy",
        "n=67108867",
        0.238,
        0.23,
        0.24,
        0.22,
        20,
        speedup=0.8,
        share_of_copy=0.85,
        copy_gbps=4000.0,
        gbps=3400.0,
    )
    return TaskResult("lab1", number, "saxpy", "lab1/03_saxpy.cu", verdict, timings=[t])


def test_a_cards_block_is_written_at_the_marker_then_replaced_and_another_card_goes_after(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Lab\n\ntext\n\n<!-- timings:lab1 -->\n\nmore text\n")
    assert timings.write(readme, "lab1", [result("03")], ENV, "make bench-lab1 SOLUTIONS=1") == "inserted"
    text = readme.read_text()
    assert "NVIDIA H200, driver 580.1, CUDA toolkit 13.0.88, torch 2.11.0" in text and "4.00 TB/s" in text
    assert "| lab1/03 `saxpy` (n=67108867) | 238.0 µs | 0.80× torch | 85% |" in text
    assert timings.write(readme, "lab1", [result("03"), result("04", Verdict.WRONG)], ENV, "cmd") == "replaced"
    assert readme.read_text().count("timings:lab1:NVIDIA H200 begin") == 1
    assert "lab1/04" not in readme.read_text()  # numbers of wrong code are never shown
    h100 = {**ENV, "gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.1"}]}
    assert timings.write(readme, "lab1", [result("03")], h100, "cmd") == "inserted"
    text = readme.read_text()
    assert text.index("NVIDIA H200 end") < text.index("NVIDIA H100 80GB HBM3 begin") < text.index("more text")


def test_without_a_marker_nothing_is_written(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Lab\n")
    assert timings.write(readme, "lab1", [result("03")], ENV, "cmd").startswith("not written")
    assert readme.read_text() == "# Lab\n"
