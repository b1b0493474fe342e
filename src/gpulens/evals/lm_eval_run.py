"""Run lm-evaluation-harness in this process on a model object (so a quantized model in memory is
evaluated as it is), offline, on a task defined in a local folder (`--include_path`).

lm-eval is an optional extra (`pip install 'gpulens[quant]'`), imported only here and only when called.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError


def _lm_eval() -> Any:
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise BadInputError(f"lm-evaluation-harness is not installed ({e.name}).",
                            hint="Install the extra: pip install 'gpulens[quant]' (or give your own evaluator with --eval-cmd).") from None
    return lm_eval, HFLM, TaskManager


def per_example_metrics(model: Any, tokenizer: Any, task: str, include_path: Path | None, *, limit: int | None = None,
                        batch_size: int = 8, device: str = "cpu") -> list[dict[str, Any]]:
    """lm-eval's per-document records of `task` (what `--log_samples` writes), for `model`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the task and its data are local
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    lm_eval, HFLM, TaskManager = _lm_eval()
    if include_path is not None and not include_path.is_dir():
        raise BadInputError(f"There is no task folder {include_path}.", hint="Point --include-path at the folder that holds the task's YAML.")
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    if task not in manager.all_tasks:
        raise BadInputError(f"lm-eval knows no task {task!r}" + (f" in {include_path}" if include_path else "") + ".",
                            hint="Name a task defined in a YAML file under --include-path.")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, limit=limit, log_samples=True)
    return list(out["samples"][task])
