"""The tracker bridge against the real libraries, offline: W&B (offline mode, the run's .wandb file
read back with W&B's own protobuf), MLflow (a local file store, read back with MlflowClient) and
TensorBoard (event files read back with TensorBoard's EventAccumulator). Tiny models on CPU."""

from __future__ import annotations

import json
import socket
import time

import pytest

from gpulens.store import Store
from gpulens.vocab import names as N

pytestmark = pytest.mark.slow


def _tiny_lightning(L, torch):
    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
    return Tiny(), torch.utils.data.DataLoader(data, batch_size=8)  # 6 steps an epoch


def _trainer(L, tmp_path, callback, logger):
    return L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=logger, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])


def _wandb_records(path):
    """The records of a W&B run file: its LevelDB-log framing (7-byte header, 32 KiB blocks, 7-byte
    record headers) around W&B's own protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL / FIRST start a record
        if kind in (1, 4):  # FULL / LAST end one
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def test_lightning_wandb_logger_gets_the_step_breakdown_and_findings(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    from gpulens.integrations.lightning import GpulensCallback

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="gpulens-test", save_dir=str(tmp_path), offline=True)
    model, loader = _tiny_lightning(L, torch)
    cb = GpulensCallback(job="wb", store=tmp_path / "wb.db", trackers="auto", flush_interval_seconds=0.1)
    _trainer(L, tmp_path, cb, logger).fit(model, loader)
    import wandb

    run_dir = logger.experiment.dir
    logger.experiment.finish()
    wandb.teardown()  # the W&B service writes the run file asynchronously: wait for it to end
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert str(run_file.parent) in run_dir
    rows, summary = [], {}
    for rec in _wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in rec.summary.update})
    steps = [r for r in rows if "gpulens/train_step_seconds" in r]
    assert [r["gpulens_step"] for r in steps] == [0, 1, 2, 3, 4, 5]
    assert all(r["gpulens/train_step_seconds"] > 0 and r["gpulens/train_batch_size"] == 8 for r in steps)
    assert all("gpulens/train_compute_seconds" in r for r in steps)
    with Store(tmp_path / "wb.db") as st:  # the same numbers as the store's
        assert [r["gpulens/train_step_seconds"] for r in steps] == st.query(N.TRAIN_STEP_SECONDS, {"train_job": "wb"})[0].value
    # the findings: one table (W&B flattens its reference into nested keys), their count in the summary
    findings = [r for r in rows if "gpulens/findings/_type" in r]
    assert len(findings) == 1 and findings[0]["gpulens/findings/_type"] == "table-file"
    assert findings[0]["gpulens/findings/ncols"] == 5 and summary["gpulens/findings_count"] == findings[0]["gpulens/findings/nrows"]


def test_hf_trainer_reporting_to_mlflow_and_tensorboard_gets_the_steps_and_findings(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    mlflow = pytest.importorskip("mlflow")
    from gpulens.integrations.hf import GpulensTrainerCallback

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local file store: no server, no network
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "gpulens-test")
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    mlflow.set_tracking_uri(uri)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 128, (24, 16))
    train = [{"input_ids": r, "labels": r} for r in ids]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=5, logging_steps=1,
                                          save_strategy="no", report_to=["mlflow", "tensorboard"], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    cb = GpulensTrainerCallback(job="mlf", store=tmp_path / "mlf.db", tokens_per_sample=16, trackers="auto", flush_interval_seconds=0.1)
    transformers.Trainer(model=model, args=args, train_dataset=train, callbacks=[cb]).train()
    client = mlflow.tracking.MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "gpulens-test"]
    (run,) = client.search_runs([exp.experiment_id])
    history = client.get_metric_history(run.info.run_id, "gpulens/train_step_seconds")
    assert sorted(m.step for m in history) == [0, 1, 2, 3, 4]
    tps = client.get_metric_history(run.info.run_id, "gpulens/train_tokens_per_second")
    assert len(tps) == 5 and all(m.value > 0 for m in tps)
    assert "loss" in run.data.metrics  # the Trainer's own logging is untouched
    path = client.download_artifacts(run.info.run_id, "gpulens/findings.json", str(tmp_path / "dl"))
    assert isinstance(json.loads(open(path).read())["findings"], list)
    assert client.get_run(run.info.run_id).data.tags["gpulens/findings_count"].isdigit()
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "out" / "runs" / "gpulens"), size_guidance={"scalars": 0})
    acc.Reload()  # gpulens's TensorBoard run, beside the Trainer's dated one
    assert [e.step for e in acc.Scalars("gpulens/train_step_seconds")] == [0, 1, 2, 3, 4]


def test_lightning_tensorboard_logger_gets_steps_gpu_readings_and_findings(tmp_path):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpulens.integrations.lightning import GpulensCallback

    db = tmp_path / "tb.db"
    with Store(db) as st:  # an agent on this host sampled GPU 0 just now
        st.write("gpu_utilization_ratio", {"gpu": "0", "host": socket.gethostname()}, time.time(), 0.87)
        st.write("gpu_utilization_ratio", {"gpu": "1", "host": "another-host"}, time.time(), 0.5)
        st.flush()
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb")
    model, loader = _tiny_lightning(L, torch)
    cb = GpulensCallback(job="tb", store=db, trackers="auto", tracker_every_n_steps=2, flush_interval_seconds=0.1)
    _trainer(L, tmp_path, cb, logger).fit(model, loader)
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars("gpulens/train_step_seconds")] == [0, 2, 4]  # one step in two
    assert "gpulens/train_data_wait_ratio" in scalars
    assert [e.value for e in acc.Scalars("gpulens/gpu0/gpu_utilization_ratio")] == [pytest.approx(0.87)]  # logged once per 30 s
    assert not any(t.startswith("gpulens/gpu1/") for t in scalars)  # another host's GPU
    (text,) = acc.Tensors("gpulens/findings/text_summary")  # the text plugin's tag
    body = text.tensor_proto.string_val[0].decode()
    assert body == "no findings" or body.startswith("| kind | severity |"), body


def test_a_failing_tracker_is_left_out_and_training_goes_on(tmp_path, monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("mlflow")
    import mlflow

    from gpulens.integrations.lightning import GpulensCallback
    from gpulens.integrations.trackers import MlflowTracker

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri())
    gone = MlflowTracker(run_id="0" * 32, client=client)  # a run that does not exist: every call fails
    model, loader = _tiny_lightning(L, torch)
    cb = GpulensCallback(job="bad", store=tmp_path / "bad.db", trackers=[gone], flush_interval_seconds=0.1)
    _trainer(L, tmp_path, cb, False).fit(model, loader)
    assert cb.trackers.trackers == []
    assert "the mlflow tracker failed and is left out" in caplog.text
    with Store(tmp_path / "bad.db") as st:
        assert len(st.events(N.EV_TRAIN_STEP)) == 6


def test_unknown_or_missing_tracker_is_one_clear_error():
    from gpulens.errors import MonitorUsageError
    from gpulens.integrations.trackers import make_trackers

    with pytest.raises(MonitorUsageError, match="Unknown tracker 'neptune'"):
        make_trackers(["neptune"])
    assert make_trackers(None) == [] and make_trackers("auto") == []  # nothing active: nothing to log to
