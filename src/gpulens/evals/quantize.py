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
