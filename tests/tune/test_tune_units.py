"""The tune's parts that need no process: knobs, the command template, the order of changes, samples."""

from __future__ import annotations

import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.tune.command import CommandTemplate, fill_values
from gpulens.tune.knobs import parse_knob, parse_knobs, propose
from gpulens.tune.loop import next_changes
from gpulens.tune.train import block_throughputs
from gpulens.workload.training.records import StepRecord


@pytest.mark.parametrize("text", ["workers", "workers=", "=1,2", "workers=1,,2", "workers=1,1", "9x=1"])
def test_a_malformed_knob_is_one_sentence(text):
    with pytest.raises(BadInputError, match="--knob"):
        parse_knob(text)


def test_known_knobs_are_ordered_as_the_guides_order_fixes():
    knobs = parse_knobs(["precision=fp32,bf16", "batch=8,16", "workers=0,4", "lr=1e-3,3e-4"])
    order = [c.text for c in next_changes(knobs, {k.name: k.baseline for k in knobs}, set(), [])]
    assert order == ["workers=4", "batch=16", "precision=bf16", "lr=3e-4"]
    # A finding pulls the knobs that address it to the front.
    first = next_changes(knobs, {k.name: k.baseline for k in knobs}, set(), ["oom"])[0]
    assert first.text == "batch=16" and first.finding == "oom"


def test_the_micro_batch_keeps_the_effective_batch():
    t = CommandTemplate.of("python train.py --micro-batch {micro_batch} --accum {accum=4}")
    knobs = parse_knobs(["micro_batch=8,16,2"])
    t.check(knobs)
    assert t.render(fill_values(t, knobs, {"micro_batch": "16"}, None))[-1] == "2"
    assert t.render(fill_values(t, knobs, {"micro_batch": "2"}, None))[-1] == "16"


def test_a_knob_missing_from_the_command_or_a_placeholder_without_value_is_bad_input():
    t = CommandTemplate.of("python train.py --workers {workers} --seed {seed}")
    with pytest.raises(BadInputError, match="does not appear in the command"):
        t.check(parse_knobs(["workers=0,2", "batch=8,16"]))
    with pytest.raises(BadInputError, match=r"\{seed\} has no value"):
        t.check(parse_knobs(["workers=0,2"]))


def test_blocks_sum_work_over_time_so_alternating_waits_do_not_bias_them():
    # A loader with two workers: batches arrive in pairs, a long wait then none.
    steps, t = [], 0.0
    for i in range(8):
        d = 0.09 if i % 2 == 0 else 0.01
        steps.append(StepRecord(t, t + d, step=i, step_s=d, samples=4, tokens=100))
        t += d
    assert block_throughputs("tokens_per_second", steps, 4) == pytest.approx([400 / 0.2, 400 / 0.2])
    assert block_throughputs("tokens_per_second", [StepRecord(0, 1, step_s=1, samples=4)] * 4, 4) is None


def test_beginner_proposals_start_from_the_written_value():
    assert propose("workers", "0", cpu_count=8).values == ("0", "2", "4", "8")
    assert propose("batch", "16").values == ("16", "32", "8")
    assert propose("pin_memory", "false").values == ("false", "true")
    assert propose("seed", "1") is None


def test_the_planner_check_reads_batch_accumulation_precision_and_checkpointing_from_the_setting():
    from gpulens.tune.fit import FitCheck

    t = CommandTemplate.of("python train.py --mbs {micro_batch} --accum {accum=8} --dtype {precision=fp32} --ckpt {grad_ckpt=0}")
    knobs = parse_knobs(["micro_batch=1,8", "grad_ckpt=0,1"])
    check = FitCheck("llama-3.2-1b", "l4", seq=1024)
    small = check.check(t, knobs, {"micro_batch": "1", "grad_ckpt": "0"})
    big = check.check(t, knobs, {"micro_batch": "8", "grad_ckpt": "0"})
    big_ckpt = check.check(t, knobs, {"micro_batch": "8", "grad_ckpt": "1"})
    assert small.peak_bytes < big_ckpt.peak_bytes < big.peak_bytes
    from gpulens.plan.catalog import find_gpu

    assert small.capacity_bytes == big.capacity_bytes == find_gpu("l4").memory_bytes  # the usable capacity nvidia-smi shows


def test_cli_bad_input_exits_2(capsys, tmp_path):
    rc = main(["tune", "train", "--store", str(tmp_path / "s.db"), "--knob", "workers=0,2", "--", "python", "train.py"])
    assert rc == 2
    assert "does not appear in the command" in capsys.readouterr().err
    rc = main(["tune", "train", "--store", str(tmp_path / "s.db"), "--", "python", "train.py"])
    assert rc == 2
    assert "nothing to tune" in capsys.readouterr().err
    # it said "The the budget must be above zero"
    rc = main(["tune", "train", "--store", str(tmp_path / "s.db"), "--knob", "workers=0,2", "--budget", "0", "--", "python", "train.py", "{workers}"])
    assert rc == 2
    assert "The --budget must be above zero, not '0'." in capsys.readouterr().err


def test_a_monitor_created_without_a_store_attaches_to_the_tune_through_the_environment(tmp_path, monkeypatch):
    from gpulens.store import Store
    from gpulens.vocab import names as N
    from gpulens.workload.training import TrainingMonitor

    monkeypatch.setenv("GPULENS_STORE", str(tmp_path / "tune.db"))
    monkeypatch.setenv("GPULENS_RUN", "tune-1-t0-r0")
    mon = TrainingMonitor(job="j", cuda_timing=False)
    with mon.step(samples=2):
        pass
    mon.close()
    with Store(tmp_path / "tune.db") as s:
        (start,) = s.events(N.EV_TRAIN_START)
        assert start.data["run"] == "tune-1-t0-r0"
        assert len(s.events(N.EV_TRAIN_STEP)) == 1
    # A store given in code wins over the environment.
    mon = TrainingMonitor(job="j", store=tmp_path / "own.db", cuda_timing=False)
    mon.close()
    assert mon.store.path == tmp_path / "own.db"


def test_a_command_that_cannot_start_is_bad_input_naming_it(capsys, tmp_path):
    rc = main(["tune", "train", "--store", str(tmp_path / "s.db"), "--knob", "workers=0,2", "--",
               str(tmp_path / "no-such-trainer"), "--workers", "{workers}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "baseline could not be measured" in err and "no-such-trainer" in err and "No such file" in err


def test_the_terminal_report_fits_80_columns_without_cutting_a_figure():
    from rich.console import Console

    from gpulens.tune.report import terminal
    from gpulens.tune.result import Trial, TuneResult
    from gpulens.tune.stats import Estimate

    base = Trial(0, {"max_batch": "1"}, {}, "baseline", "", "requests_per_second", Estimate(6, 50, 50, 60),
                 extra={"cold_start_seconds": 0.61})
    best = Trial(1, {"max_batch": "128"}, {"max_batch": "128"}, "kept", "it meets every SLO at 160 req/s",
                 "requests_per_second", Estimate(6, 1600, 1600, 3200), speedup=32.0, speedup_ci=(26.67, 64.0),
                 extra={"cold_start_seconds": 12.5})
    result = TuneResult("serve", "serve", "requests_per_second", base, [best], best, 32.0, (26.67, 64.0), [],
                        "every knob value was tried", "vllm serve m --max-num-seqs 128", "vllm serve m --max-num-seqs 1")
    console = Console(width=80, record=True, color_system=None)
    console.print(terminal(result))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for figure in ("max_batch=128", "1,600", "1,600 … 3,200", "×32.00", "(26.67…64.00)", "12.5 s", "kept"):
        assert figure in text, figure


def test_a_speed_up_without_a_failing_rate_reads_as_a_lower_bound():
    """`tune serve` printed "speed-up ×4.00" where the best setting met every SLO at every rate
    offered: its capacity is a lower bound, so is the speed-up, and only against the baseline's
    failing rate (new best / old lowest failing), not its best."""
    from types import SimpleNamespace

    from gpulens.tune.report import terminal
    from gpulens.tune.result import Trial, TuneResult
    from gpulens.tune.serve import _ServeSteps
    from gpulens.tune.stats import Estimate

    steps = _ServeSteps.__new__(_ServeSteps)
    steps.sweeps = {0: SimpleNamespace(best=10.0, lowest_failing=12.0, probes=[]),
                    1: SimpleNamespace(best=40.0, lowest_failing=None, probes=[])}
    base = Trial(0, {"max_batch": "1"}, {}, "baseline", "", "requests_per_second", Estimate(1, 10, 10, 12))
    trial = Trial(1, {"max_batch": "8"}, {"max_batch": "8"}, "kept", "", "requests_per_second", Estimate(1, 40, 40, None))
    steps.judge(base, trial)
    assert trial.speedup_at_least and trial.speedup == pytest.approx(40 / 12) and trial.speedup_ci is None
    result = TuneResult("serve", "serve", "requests_per_second", base, [trial], trial, trial.speedup, None, [],
                        "every knob value was tried", "b", "a", speedup_at_least=True)
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(terminal(result))
    text = console.export_text()
    assert "at least ×3.33" in text and "×4.00" not in text
    assert result.to_dict()["best"]["speedup_at_least"] is True
