"""LoRA for the torch trainer (`[trainer.lora]`): a low-rank adapter trained on frozen weights, with peft.

    check_targets(model, lora.target_modules)       # one line naming the linear layers the policy has
    add_adapter(model, lora)                        # peft's LoRA layers put in place; every other weight frozen
    for name, weight in merged_weights(model): ...  # what the engines load: W + (alpha / rank) B A, by HF name
    save_adapter(model, folder); load_adapter(model, lora, folder)   # peft's own adapter format

The engines get the merged weights of the targeted layers only, under their Hugging Face names, through
the same weight sync as a full update (`update_weights_from_distributed`, or a hand-over on one GPU): the
other weights never change from policy v0, which every engine starts from (and a restarted one comes back
with), so an engine that loads them serves exactly the trainer's policy. Neither SGLang nor rl360's engine
needs anything new, and an engine runs a plain model at full speed, with no adapter in its forward pass.
Sending A and B instead would be ~r(in + out) / (in x out) of the bytes but needs the engines to merge:
each would have to keep W (a second copy of the targeted weights) or serve the adapter unmerged, which
SGLang does through its LoRA serving (`--enable-lora`, an adapter named in every request), not through a
weight update. docs/trainer.md, "LoRA".

The adapter is saved as peft saves it (`adapter_config.json`, `adapter_model.safetensors`), so a checkpoint's
adapter also loads with peft or into SGLang's LoRA serving. Tests: tests/trainer/test_lora.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from rl360cli.errors import Rl360Error
from rl360cli.trainer.config import LoraConfig

ADAPTER = "default"  # peft's name for a model's one adapter
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def linear_layers(model: torch.nn.Module) -> tuple[list[str], dict[str, str]]:
    """The names of `model`'s linear layers that an adapter may target, and those it may not, each with
    the parameter its weight is shared with (a tied output layer's weight is the input embedding's: a
    merged update of one would change the other)."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name.rsplit(".", 1)[0])
    free, tied = [], {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            others = [owner for owner in owners.get(id(module.weight), []) if owner != name]
            if others:
                tied[name] = others[0]
            else:
                free.append(name)
    return free, tied


def matches(module_name: str, target: str) -> bool:
    """peft's rule for a list of target names: the whole module name or a dotted suffix of it."""
    return module_name == target or module_name.endswith("." + target)


def check_targets(model: torch.nn.Module, target_modules: Iterable[str]) -> None:
    """Raise a one-line `Rl360Error` unless every target names at least one untied linear layer of `model`."""
    free, tied = linear_layers(model)
    kinds = sorted({name.rsplit(".", 1)[-1] for name in free})
    for target in target_modules:
        if any(matches(name, target) for name in free):
            continue
        shared = next((f"{name} shares its weight with {owner} (tied embeddings)"
                       for name, owner in tied.items() if matches(name, target)), None)  # fmt: skip
        raise Rl360Error(
            f"[trainer.lora] target_modules: {target!r} "
            + (f"cannot be adapted: {shared}" if shared else "is not a linear layer of the policy")
            + f"; its {type(model).__name__} has {', '.join(kinds)}",
            fix="set target_modules to some of those (e.g. [\"q_proj\", \"v_proj\"])",
        )


def check_targets_of_folder(folder: Path, target_modules: Iterable[str]) -> None:
    """`check_targets` on the policy saved in `folder`, built from its config alone (no weights are read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_targets(model, target_modules)


def add_adapter(model: torch.nn.Module, lora: LoraConfig) -> torch.nn.Module:
    """Put peft's LoRA layers on `lora.target_modules` of `model` (in place; A drawn from torch's RNG, B zero,
    so the model computes what it did) and freeze every other weight; returns `model`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    check_targets(model, lora.target_modules)
    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                            lora_dropout=0.0, bias="none")
    inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return model


def adapted_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(module name, peft LoRA layer) of every adapted layer, in the model's order."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name, module


@torch.no_grad()
def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each adapted layer's weight with its adapter merged in, W + (alpha / rank) B A (peft's own delta), under
    the layer's Hugging Face name (`model.layers.0.self_attn.q_proj.weight`): new tensors, the model untouched."""
    for name, layer in adapted_layers(model):
        base = layer.get_base_layer().weight
        yield f"{name}.weight", base + layer.get_delta_weight(ADAPTER).to(base.dtype)


def adapter_bytes(model: torch.nn.Module) -> int:
    """The bytes of the adapter's own matrices (A and B of every adapted layer)."""
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters()
               if ".lora_A." in name or ".lora_B." in name)  # fmt: skip


def save_adapter(model: torch.nn.Module, folder: Path) -> None:
    """The adapter as peft saves it: `adapter_config.json` and `adapter_model.safetensors`."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config[ADAPTER].save_pretrained(str(folder))
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER, save_embedding_layers=False)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}, str(folder / ADAPTER_WEIGHTS))


def load_adapter(model: torch.nn.Module, lora: LoraConfig, folder: Path) -> None:
    """Set `model`'s adapter (from `add_adapter(model, lora)`) to the one saved in `folder`; an adapter of
    another shape (rank, alpha, targets) is refused in one line."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise Rl360Error(f"{folder} holds no LoRA adapter ({ADAPTER_WEIGHTS})", fix="resume from another checkpoint")
    saved = PeftLoraConfig.from_pretrained(str(folder))
    was = (saved.r, float(saved.lora_alpha), sorted(saved.target_modules))
    now = (lora.rank, float(lora.alpha), sorted(lora.target_modules))
    if was != now:
        raise Rl360Error(f"the checkpoint's LoRA adapter is rank {was[0]}, alpha {was[1]:g} on {', '.join(was[2])}; "
                         f"[trainer.lora] asks for rank {now[0]}, alpha {now[1]:g} on {', '.join(now[2])}",
                         fix="resume with [trainer.lora] as the run started, or start a new run")  # fmt: skip
    result = set_peft_model_state_dict(model, load_file(str(folder / ADAPTER_WEIGHTS)), adapter_name=ADAPTER)
    if result.unexpected_keys:
        raise Rl360Error(f"{folder}: the adapter holds tensors the model has no place for "
                         f"({', '.join(result.unexpected_keys[:3])})", fix="resume with the run's own policy")  # fmt: skip
