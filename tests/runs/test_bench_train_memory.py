"""`gpulens bench train` with a model or batch that does not fit in memory: one sentence naming the
model's size and what to make smaller, exit 2, never the allocator's traceback. A run whose floor
(weights, gradients, AdamW state and one activation per block) is already beyond the machine's
memory is refused before anything is allocated; one that fails at an allocation is refused there
(shown here under an address-space limit, so that nothing big is ever touched)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpulens.cli.main import main

torch = pytest.importorskip("torch")

from gpulens.bench.train import (  # noqa: E402
    TRAIN_BYTES_PER_PARAMETER,
    build_model,
    device_memory,
    memory_floor_bytes,
    parameter_count,
)

HINT = "Make the model smaller (--layers/--hidden) or the batch (--batch-size/--seq-len)."


def refused(capsys, *args: str) -> str:  # noqa: ANN001
    rc = main(["bench", "train", "--size", "tiny", "--device", "cpu", "--no-record", *args])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2, err
    assert err.startswith("error: ") and "Traceback" not in err and err.endswith(HINT), err
    return err


@pytest.mark.parametrize(("layers", "hidden", "ffn"), [(2, 64, 4), (3, 48, 2), (1, 8, 1)])
def test_the_parameter_count_is_the_built_models(layers, hidden, ffn):
    model = build_model(torch, layers, hidden, 4 if hidden % 4 == 0 else 1, ffn, False)
    assert parameter_count(layers, hidden, ffn) == sum(p.numel() for p in model.parameters())


def test_a_model_far_beyond_memory_is_refused_before_it_is_built(capsys):
    err = refused(capsys, "--layers", "100000", "--hidden", "100000", "--heads", "8")
    n = parameter_count(100000, 100000, 4)
    assert f"error: The model ({n:,} parameters, " in err and " in fp32) with batch 8 × 512 tokens does not fit in " in err
    assert "training it needs at least " in err and "(weights, gradients and AdamW state: " in err


def test_a_batch_far_beyond_memory_is_refused_before_it_is_allocated(capsys):
    err = refused(capsys, "--seq-len", "100000000", "--batch-size", "1000000")
    assert "with batch 1,000,000 × 100,000,000 tokens does not fit in " in err and "; activations: " in err
    # the sweep refuses the same way when not even its first batch fits (a table of one OOM said nothing)
    err = refused(capsys, "--seq-len", "100000000", "--batch-size", "1000000", "--sweep-batch", "--max-batch", "1000000")
    assert "with batch 1,000,000 × 100,000,000 tokens does not fit in " in err


def test_the_floor_is_below_what_a_real_step_uses():
    """The refusal up front is safe: the floor never exceeds what a run really takes (a tiny run's
    peak RSS holds far more besides)."""
    layers, hidden, batch, seq = 2, 64, 2, 32
    n = parameter_count(layers, hidden, 4)
    floor = memory_floor_bytes(n, layers, hidden, batch, seq)
    assert floor == TRAIN_BYTES_PER_PARAMETER * n + 4 * batch * seq * hidden * (layers + 1)
    have = device_memory(torch, torch.device("cpu"))
    assert have is not None and have[0] > floor


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status are Linux's")
def test_an_allocation_that_fails_is_one_sentence():
    """Under an address-space limit 150 MiB above what the process holds, a 1-layer model of hidden
    4096 (a 192 MiB qkv matrix) fails at that allocation, which the kernel refuses without giving
    memory: the allocator's RuntimeError becomes the sentence, exit 2."""
    code = textwrap.dedent("""
        import resource, sys
        import torch
        import gpulens.bench.train
        from gpulens.cli.main import main
        vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + 150 * 2**20, resource.RLIM_INFINITY))
        sys.exit(main(["bench", "train", "--device", "cpu", "--layers", "1", "--hidden", "4096", "--heads", "8",
                       "--seq-len", "8", "--batch-size", "1", "--steps", "2", "--warmup", "0", "--precision", "fp32",
                       "--no-record"]))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    err = " ".join(p.stderr.split())
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in err, err
    n = parameter_count(1, 4096, 4)
    assert (f"error: The model ({n:,} parameters, 768.2 MiB in fp32) with batch 1 × 8 tokens does not fit in "
            "this machine's memory: allocating 192.0 MiB more failed (DefaultCPUAllocator: ") in err or \
           "this container's memory limit: allocating 192.0 MiB more failed" in err, err
    assert err.endswith(HINT), err
