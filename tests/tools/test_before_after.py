"""benchmarks/before_after.py: the before -> after table from bench_modes JSONs (medians over runs)."""
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _write(path: Path, rates: dict) -> Path:
    runs = {lab: [{"batches_per_s": v}] for lab, v in rates.items()}
    path.write_text(json.dumps({"workloads": {"w": {"runs": runs}}}))
    return path


def test_table_reports_medians_and_ratios(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import before_after

    before = [_write(tmp_path / f"b{i}.json", {"sync/t2": v, "oac@4/t2": 2 * v}) for i, v in enumerate((10, 12, 14))]
    after = [_write(tmp_path / f"a{i}.json", {"sync/t2": v, "oac@4/t2": v}) for i, v in enumerate((11, 13, 15))]
    row = before_after.table(before, after).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "w"
    assert cells[1] == "12.00 -> 13.00 (1.08x)"  # sync: medians 12 and 13
    assert cells[2] == "-" and cells[3] == "-"  # dgl and async@4 were not run
    assert cells[4] == "24.00 -> 13.00 (0.54x)"


def test_out_is_absolute_whatever_the_runs_working_directory(tmp_path, monkeypatch):
    """Regression: a relative ``--out`` was resolved in each run's working directory, so the base's JSONs went
    into its temporary worktree and were removed with it (the table then failed on a missing file)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import before_after

    monkeypatch.chdir(tmp_path)
    args = before_after.parse(["--base", "HEAD", "--out", "rel/dir"])
    assert args.out == tmp_path / "rel" / "dir" and args.out.is_absolute()
