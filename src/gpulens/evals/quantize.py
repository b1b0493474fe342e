"""Weight quantization of a PyTorch model in place, with a maintained library: torchao first, and
optimum-quanto where torchao cannot run here (torchao's int4 kernels need `mslk` or a GPU).

| --to | torchao | optimum-quanto |
| --- | --- | --- |
| int8 | Int8WeightOnlyConfig | qint8 |
| int4 | Int4WeightOnlyConfig (group 32) | qint4 |
| fp8  | Float8WeightOnlyConfig | qfloat8 |

Both are optional extras (`pip install 'gpulens[quant]'`), imported only when called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpulens.errors import BadInputError

log = logging.getLogger(__name__)

QUANT_TARGETS = ("int8", "int4", "fp8")
Quantizer = Callable[[Any], str]  # quantizes a model in place, returns what it used (for the record)


def _torchao(model: Any, to: str) -> None:
    from torchao.quantization import quantize_

    if to == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        quantize_(model, Int8WeightOnlyConfig())
    elif to == "int4":
        from torchao.quantization import Int4WeightOnlyConfig

        quantize_(model, Int4WeightOnlyConfig(group_size=32))
    else:
        from torchao.quantization import Float8WeightOnlyConfig

        quantize_(model, Float8WeightOnlyConfig())


def _quanto(model: Any, to: str) -> str:
    from optimum.quanto import freeze, qfloat8, qint4, qint8, quantize

    quantize(model, weights={"int8": qint8, "int4": qint4, "fp8": qfloat8}[to])
    freeze(model)
    return f"optimum-quanto {to} weights"


def quantizer_for(to: str) -> Quantizer:
    """A quantizer to `to`: torchao if it can, else optimum-quanto."""
    if to not in QUANT_TARGETS:
        raise BadInputError(f"--to must be one of {', '.join(QUANT_TARGETS)}, not {to!r}.")

    def run(model: Any) -> str:
        # torchao refuses before it changes a module (a missing kernel package is an ImportError at
        # the first one, an unsupported device a RuntimeError), so the fallback gets the model intact.
        try:
            _torchao(model, to)
            return f"torchao {to} weight-only"
        except ImportError as e:
            why = f"torchao: {e}"
        except (RuntimeError, NotImplementedError, ValueError, AssertionError) as e:
            why = f"torchao: {type(e).__name__}: {e}"
        log.info("torchao cannot quantize to %s here (%s); trying optimum-quanto", to, why)
        try:
            return _quanto(model, to) + f" (torchao could not: {why[:120]})"
        except ImportError as e:
            raise BadInputError(f"Neither torchao nor optimum-quanto can quantize to {to} here ({why}; optimum-quanto: {e}).",
                                hint="Install the extra: pip install 'gpulens[quant]'.") from None

    return run


def _torchao_config(to: str) -> Any:
    from torchao.quantization import Float8WeightOnlyConfig, Int4WeightOnlyConfig, Int8WeightOnlyConfig

    return {"int8": lambda: Int8WeightOnlyConfig(), "int4": lambda: Int4WeightOnlyConfig(group_size=32),
            "fp8": lambda: Float8WeightOnlyConfig()}[to]()


def save_quantized(model_dir: Any, to: str, out_dir: Any) -> str:
    """Write `model_dir` quantized to `to` as a Hugging Face folder that `from_pretrained` loads as
    it is (transformers' TorchAoConfig, saved without safetensors since torchao's tensors pickle),
    with the tokenizer beside it: what a user's own evaluation command reads. Returns what it used."""
    if to not in QUANT_TARGETS:
        raise BadInputError(f"--to must be one of {', '.join(QUANT_TARGETS)}, not {to!r}.")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

        config = _torchao_config(to)
    except ImportError as e:
        raise BadInputError(f"Writing a quantized model folder needs transformers and torchao ({e}).",
                            hint="Install the extra: pip install 'gpulens[quant]'.") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", quantization_config=TorchAoConfig(config))
        model.save_pretrained(out_dir, safe_serialization=False)
    except (ImportError, RuntimeError, NotImplementedError, ValueError, AssertionError) as e:
        raise BadInputError(f"torchao cannot write a {to} model folder here ({type(e).__name__}: {str(e)[:160]}).",
                            hint="Without --eval-cmd, quant check quantizes in memory (optimum-quanto where torchao cannot) "
                                 "and evaluates with lm-eval's --task.") from None
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out_dir)
    return f"torchao {to} weight-only (saved folder)"

