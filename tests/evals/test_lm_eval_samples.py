"""`eval compare` reads a `--log_samples` file that lm-evaluation-harness itself wrote, offline, for a
tiny model on a local task (about half a minute: lm-eval's start-up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval_rig import parity_task, tiny_model

from gpulens.cli.main import main

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install lm-eval)")
pytest.importorskip("transformers", reason="needs transformers")


@pytest.mark.slow
def test_a_file_lm_eval_wrote_is_read_and_paired(tmp_path: Path, capsys) -> None:
    model, task, out = tiny_model(tmp_path / "model"), parity_task(tmp_path / "task"), tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
         "--tasks", "parity", "--include_path", str(task), "--device", "cpu", "--batch_size", "8",
         "--log_samples", "--output_path", str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (samples,) = out.rglob("samples_parity_*.jsonl")
    # The candidate: lm-eval's own file with ten examples' acc turned to 0 (a real drop) ...
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 40 and all(r["acc"] in (0.0, 1.0) for r in rows)
    right = [r for r in rows if r["acc"] == 1.0][:10]
    for r in right:
        r["acc"] = 0.0
    worse = tmp_path / "worse" / samples.name
    worse.parent.mkdir()
    worse.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # ... against the folder lm-eval wrote (found by task), and against itself.
    # 40 examples without a flip bound the drop at about 9 points: inconclusive at the default margin of one
    assert main(["eval", "compare", str(out), str(out), "--metric", "acc", "--task", "parity"]) == 1
    assert "40 examples are too few" in " ".join(capsys.readouterr().out.split())
    assert main(["eval", "compare", str(out), str(out), "--metric", "acc", "--task", "parity", "--margin", "0.1"]) == 0
    assert main(["eval", "compare", str(out), str(worse), "--metric", "acc", "--format", "json"]) == 1
    j = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert j["baseline"]["format"] == "lm-eval" and j["examples"] == 40
    assert j["regressed"] == len(right) and j["improved"] == 0
