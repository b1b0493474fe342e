"""The Lightning and Hugging Face Trainer callbacks, each on a tiny model built from a config on
CPU (no downloads), writing to a real store."""

from __future__ import annotations

import pytest

from gpulens.store import Store
from gpulens.vocab import names as N

pytestmark = pytest.mark.slow


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def test_lightning_callback_records_steps_checkpoints_and_oom(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")
    from gpulens.integrations.lightning import GpulensCallback

    class Tiny(L.LightningModule):
        def __init__(self, fail_at: int | None = None):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
            self.fail_at = fail_at

        def training_step(self, batch, batch_idx):
            if batch_idx == self.fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    db = tmp_path / "l.db"
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=[GpulensCallback(job="lit", store=db, flush_interval_seconds=0.1)])
    trainer.fit(Tiny(), loader)
    trainer.save_checkpoint(tmp_path / "extra.ckpt")  # after fit: the monitor is closed, saving still works
    with Store(db) as st:
        steps = st.events(N.EV_TRAIN_STEP)
        assert len(steps) == 16
        assert all(e.data["samples"] == 8 and e.labels["train_job"] == "lit" for e in steps)
        assert all(isinstance(e.data["loss"], float) for e in steps)
        assert all(e.data.get("data_wait_s") is not None for e in steps[1:8])
        # Lightning's end-of-epoch checkpoint is timed and charged to the step before it.
        assert sum(1 for e in steps if e.data["checkpoint_s"] > 0) >= 1
    oom_db = tmp_path / "oom.db"
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[GpulensCallback(job="lit-oom", store=oom_db)])
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit(Tiny(fail_at=3), loader)
    with Store(oom_db) as st:
        (oom,) = st.events(N.EV_TRAIN_OOM)
        assert oom.data["requested_bytes"] == 2**30 and oom.data["step"] == 3
        assert len(st.events(N.EV_TRAIN_STEP)) == 3


def test_hf_trainer_callback_records_steps_loss_and_saves(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpulens.integrations.hf import GpulensTrainerCallback

    model = _tiny_llama()
    ids = torch.randint(0, 128, (32, 16))
    train = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                          max_steps=6, logging_steps=1, save_steps=3, save_strategy="steps", report_to=[], use_cpu=True,
                                          disable_tqdm=True, dataloader_num_workers=0)
    db = tmp_path / "hf.db"
    cb = GpulensTrainerCallback(job="hf", store=db, tokens_per_sample=16, flops_per_token=6 * model.num_parameters(), peak_flops=1e12, flush_interval_seconds=0.1)
    transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[cb]).train()
    with Store(db) as st:
        steps = st.events(N.EV_TRAIN_STEP)
        assert len(steps) == 6
        assert all(e.data["samples"] == 8 and e.data["tokens"] == 128 for e in steps)
        assert all(0 < e.data["mfu"] < 1 for e in steps)
        losses = st.query(N.TRAIN_LOSS, {"train_job": "hf"})[0].value
        assert len(losses) == 6 and all(v > 0 for v in losses)
        # save_steps=3: two checkpoints, each timed and charged to the step that triggered it.
        assert [e.data["step"] for e in steps if e.data["checkpoint_s"] > 0] == [2, 5]


EVAL_S, SAVE_S = 0.5, 0.25  # on a FakeClock, the only time that passes: each phase's value is exact


def test_lightning_validation_is_its_own_phase_not_data_wait(tmp_path) -> None:
    from gpulens.clock import FakeClock

    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")
    from gpulens.integrations.lightning import GpulensCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            clock.advance(EVAL_S)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    db = tmp_path / "v.db"
    clock = FakeClock()
    # validation after batches 4 and 8 (the sanity check before fit is not an evaluation of the run)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, val_check_interval=4, limit_val_batches=1, num_sanity_val_steps=1,
                        default_root_dir=tmp_path, callbacks=[GpulensCallback(job="lit-val", store=db, flush_interval_seconds=0.1, clock=clock)])
    trainer.fit(Tiny(), loader, loader)
    with Store(db) as st:
        evals = st.events(N.EV_TRAIN_EVAL)
        assert [e.data["after_step"] for e in evals] == [3, 7]
        # the sanity check's validation batch advanced the clock too, before fit: it is not an evaluation
        assert [e.data["seconds"] for e in evals] == [EVAL_S, EVAL_S] and clock.elapsed == 3 * EVAL_S
        assert st.query(N.TRAIN_EVAL_SECONDS, {"train_job": "lit-val"})[0].value == [EVAL_S, EVAL_S]
        steps = st.events(N.EV_TRAIN_STEP)
        # the batch after the mid-epoch validation waited for its data, not for the validation
        assert steps[4].data["data_wait_s"] == 0.0
        assert all(e.data["step_s"] == 0.0 for e in steps)


def test_hf_evaluation_and_save_are_separate_phases(tmp_path) -> None:
    from gpulens.clock import FakeClock

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpulens.integrations.hf import GpulensTrainerCallback

    clock = FakeClock()

    class SlowEvalAndSave(transformers.TrainerCallback):  # listed before gpulens's: its hooks run first
        def on_prediction_step(self, args, state, control, **kwargs):
            clock.advance(EVAL_S)  # one eval batch

        def on_save(self, args, state, control, **kwargs):
            clock.advance(SAVE_S)  # the save that just ended took SAVE_S

    model = _tiny_llama()
    ids = torch.randint(0, 128, (32, 16))
    train = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=6, logging_steps=1,
                                          eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=4, save_strategy="steps",
                                          save_steps=3, report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    db = tmp_path / "hfe.db"
    cb = GpulensTrainerCallback(job="hf-eval", store=db, flush_interval_seconds=0.1, clock=clock)
    # the evaluation runs after on_step_end, between the step and the save (and the next batch)
    transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=train[:4], callbacks=[SlowEvalAndSave(), cb]).train()
    with Store(db) as st:
        evals = st.events(N.EV_TRAIN_EVAL)
        assert [e.data["after_step"] for e in evals] == [2, 5]
        assert [e.data["seconds"] for e in evals] == [EVAL_S, EVAL_S]
        steps = st.events(N.EV_TRAIN_STEP)
        # the save is timed from the evaluation's end, the next batch's wait from the save's end
        assert [e.data["checkpoint_s"] for e in steps] == [0.0, 0.0, SAVE_S, 0.0, 0.0, SAVE_S]
        assert steps[3].data["data_wait_s"] == 0.0
